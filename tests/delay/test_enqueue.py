"""The enqueue Lambda handler with real Postgres and Kafka: dedup, late messages, bad headers."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes import KafkaEvent
from aws_lambda_powertools.utilities.data_classes.kafka_event import KafkaEventRecord
from psycopg import sql

from switchyard.core.config import Connections
from switchyard.delay.model import DEADLINE_HEADER, MESSAGE_ID_HEADER
from switchyard.delay.service import DelayService
from switchyard.delay.settings import DelaySettings
from switchyard.local import delay_runtime as runtime
from switchyard.local.functions import SAMPLE_EVENTS_DIR
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.local.msk_bridge import MskBridge, MskBridgeConfig
from tests.conftest import wait_for
from tests.delay.conftest import OutputReader, chronos_headers, committed_offsets, in_ms, msk_event, produce

enqueue_function = runtime.load_function("enqueue")
enqueue_handler = enqueue_function.lambda_handler


def invoke(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The enqueue function's work on an aws:kafka event: its outcome, as a dict."""
    return asdict(enqueue_function.enqueue(KafkaEvent(msk_event(records)), None))


def rec(message_id: str, delay_ms: float, value: bytes | None = b"v", **extra: Any) -> dict[str, Any]:
    headers = [*chronos_headers(message_id, in_ms(delay_ms)), ("test-id", message_id.encode())]
    return {"key": b"k", "value": value, "headers": headers, **extra}


def test_same_id_twice_is_enqueued_once(handler_service: DelayService) -> None:
    first = invoke([rec("dup", 60_000, b"first"), rec("dup", 60_000, b"second"), rec("other", 60_000)])
    assert (first["enqueued"], first["duplicates"]) == (2, 1)
    again = invoke([rec("dup", 30_000, b"third")])  # re-delivery (or a new submission) of a waiting id
    assert (again["enqueued"], again["duplicates"]) == (0, 1)
    assert handler_service.store.counts() == (2, 0)
    [row] = [r for r in handler_service.store.ready(handler_service.node_id, timedelta(seconds=70), 10)
             if r.id == "dup"]
    assert row.value == b"first"


def test_late_message_is_fired_immediately_and_not_stored(handler_service: DelayService,
                                                          output: OutputReader) -> None:
    result = invoke([rec("late", -5_000, key=None, value=None), rec("just-in-advance", 20)])
    assert (result["fired_immediately"], result["enqueued"]) == (2, 0)
    assert handler_service.store.counts() == (0, 0)
    ids = output.wait_for_ids({"late", "just-in-advance"}, timeout=10)
    assert sorted(ids) == ["just-in-advance", "late"]
    late = next(m for m in output.messages if dict(m.headers())["test-id"] == b"late")
    assert late.key() is None and late.value() is None
    assert {h for h, _ in late.headers()} == {"test-id"}


def test_late_message_already_stored_is_not_fired_again(handler_service: DelayService,
                                                        output: OutputReader) -> None:
    assert invoke([rec("stored", 60_000)])["enqueued"] == 1
    result = invoke([rec("stored", -1_000), rec("fresh-late", -1_000)])
    assert (result["fired_immediately"], result["duplicates"]) == (1, 1)
    assert output.wait_for_ids({"fresh-late"}, timeout=10) == ["fresh-late"]
    output.poll(0.5)
    assert output.ids() == ["fresh-late"]


BAD = [
    ("missing_message_id", [(DEADLINE_HEADER, b"2030-01-01T00:00:00Z")]),
    ("missing_deadline", [(MESSAGE_ID_HEADER, b"no-deadline")]),
    ("invalid_deadline", [(MESSAGE_ID_HEADER, b"bad-deadline"), (DEADLINE_HEADER, b"in five minutes")]),
    ("invalid_message_id", [(MESSAGE_ID_HEADER, b"x" * 200), (DEADLINE_HEADER, b"2030-01-01T00:00:00Z")]),
    ("duplicate_header", [(MESSAGE_ID_HEADER, b"a"), (MESSAGE_ID_HEADER, b"b"),
                          (DEADLINE_HEADER, b"2030-01-01T00:00:00Z")]),
    ("invalid_header_name", [(MESSAGE_ID_HEADER, b"nul-name"), (DEADLINE_HEADER, b"2030-01-01T00:00:00Z"),
                             ("bad\x00", b"x")]),
]


@pytest.mark.parametrize(("reason", "headers"), BAD, ids=[b[0] for b in BAD])
def test_bad_header_is_dropped_logged_and_counted_and_the_batch_goes_on(
    handler_service: DelayService, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    reason: str, headers: list,
) -> None:
    event = msk_event([rec("before", 60_000), {"key": b"k", "value": b"bad", "headers": headers},
                       rec("after", 60_000)])
    assert_one_drop(event, reason, handler_service, capsys, caplog)


def assert_one_drop(event: dict[str, Any], reason: str, svc: DelayService, capsys: pytest.CaptureFixture[str],
                    caplog: pytest.LogCaptureFixture, position: tuple[str, int, int] = ("delay-in", 0, 1),
                    ) -> None:
    """Through the Lambda handler: the batch succeeds, the two good records are stored, the bad one
    is logged with its position (what of it is readable; -1 where not) and counted in DelayRecordsDropped."""
    response = enqueue_handler(event, FakeLambdaContext("delay_enqueue", 60_000))
    assert response == {"batchItemFailures": []}
    assert svc.store.counts() == (2, 0)
    [log] = [r for r in caplog.records if getattr(r, "reason", None) == reason]
    assert log.levelname == "ERROR" and "/".join(map(str, position)) in log.getMessage()
    assert (log.topic, log.partition, log.offset) == position
    assert emf_metric(capsys, "DelayRecordsDropped") == 1


def emf_metric(capsys: pytest.CaptureFixture[str], name: str) -> float:
    """The value of one metric in the last EMF blob the handler printed."""
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if f'"{name}"' in line]
    value = emf[-1][name]
    return value[0] if isinstance(value, list) else value


def signed(data: bytes) -> list[int]:
    """Bytes as Lambda's MSK events carry header values: Java's signed bytes (0x80-0xFF negative)."""
    return [b - 256 if b > 127 else b for b in data]


GOOD_HEADERS = [{"chronosMessageId": list(b"good")}, {"chronosDeadline": list(b"2030-01-01T00:00:00Z")}]


def raw_event(middle: Any) -> dict[str, Any]:
    """An aws:kafka event of three records at delay-in/0/0..2, the middle one given as raw JSON."""
    def good(offset: int) -> dict[str, Any]:
        headers = [{"chronosMessageId": list(f"good-{offset}".encode())}, GOOD_HEADERS[1]]
        return {"topic": "delay-in", "partition": 0, "offset": offset, "timestamp": 0,
                "timestampType": "CREATE_TIME", "value": "dg==", "headers": headers}
    return {"eventSource": "aws:kafka", "eventSourceArn": "arn:aws:kafka:local:0:cluster/t/x",
            "bootstrapServers": "127.0.0.1:9092", "records": {"delay-in-0": [good(0), middle, good(2)]}}


def well_formed(**fields: Any) -> dict[str, Any]:
    record = {"topic": "delay-in", "partition": 0, "offset": 1, "timestamp": 0,
              "timestampType": "CREATE_TIME", "value": "dg==",
              "headers": [{"chronosMessageId": list(b"mid")}, GOOD_HEADERS[1]]}
    record.update(fields)
    return {k: v for k, v in record.items() if v is not DELETE}


def deadline(value: list[int] | None) -> dict[str, Any]:
    return well_formed(headers=[{"chronosMessageId": list(b"mid")}, {"chronosDeadline": value}])


DELETE = object()
MALFORMED = [  # what a fuzzer (or a broken producer path) can put in one record of an aws:kafka event
    ("offset_is_a_string", well_formed(offset="1"), "malformed_record"),
    ("topic_missing", {**well_formed(topic=DELETE), "partition": 0, "offset": 1}, "malformed_record"),
    ("partition_null", well_formed(partition=None), "malformed_record"),
    ("value_bad_base64", well_formed(value="a"), "malformed_record"),
    ("value_not_ascii", well_formed(value="dé=="), "malformed_record"),
    ("key_is_a_number", well_formed(key=12), "malformed_record"),
    ("headers_not_a_list", well_formed(headers={"chronosMessageId": [1]}), "malformed_record"),
    ("header_value_an_int", well_formed(headers=[{"chronosMessageId": 5},
                                                 GOOD_HEADERS[1]]), "malformed_record"),
    ("header_value_a_string", well_formed(headers=[{"chronosMessageId": "mid"}, GOOD_HEADERS[1]]),
     "malformed_record"),
    ("header_byte_out_of_range", well_formed(headers=[{"chronosMessageId": [300]}, GOOD_HEADERS[1]]),
     "malformed_record"),
    ("header_byte_huge", well_formed(headers=[{"chronosMessageId": [10**30]}, GOOD_HEADERS[1]]),
     "malformed_record"),
    ("deadline_past_year_9999", deadline(list(b"9999-12-31T23:59:59-01:00")), "invalid_deadline"),
    ("deadline_before_year_1", deadline(list(b"0001-01-01T00:00:00+01:00")), "invalid_deadline"),
    ("header_name_lone_surrogate", well_formed(headers=[{"chronosMessageId": list(b"mid")},
                                                        GOOD_HEADERS[1], {"\ud800": [1]}]),
     "invalid_header_name"),
    ("deadline_null", deadline(None), "invalid_deadline"),
]


@pytest.mark.parametrize(("middle", "reason"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_a_record_that_cannot_be_read_is_a_counted_drop_and_the_batch_is_stored(
    handler_service: DelayService, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    middle: dict[str, Any], reason: str,
) -> None:
    event = json.loads(json.dumps(raw_event(middle)))  # what Lambda hands over is plain JSON
    position = (middle.get("topic") if isinstance(middle.get("topic"), str) else repr(middle.get("topic")),
                middle["partition"] if isinstance(middle["partition"], int) else -1,
                middle["offset"] if isinstance(middle["offset"], int) else -1)
    assert_one_drop(event, reason, handler_service, capsys, caplog, position)


def test_a_record_that_is_not_an_object_is_a_counted_drop(
    handler_service: DelayService, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    event = raw_event("not a record")
    response = enqueue_handler(event, FakeLambdaContext("delay_enqueue", 60_000))
    assert response == {"batchItemFailures": []} and handler_service.store.counts() == (2, 0)
    [log] = [r for r in caplog.records if getattr(r, "reason", None) == "malformed_record"]
    assert log.levelname == "ERROR" and (log.partition, log.offset) == (-1, -1)
    assert emf_metric(capsys, "DelayRecordsDropped") == 1


def test_signed_header_bytes_and_null_header_values_are_decoded(handler_service: DelayService,
                                                                output: OutputReader) -> None:
    """Lambda sends 0x80-0xFF as negative numbers: a non-ASCII id and a binary header must work."""
    message_id = "commande-№42-ключ"
    trace = bytes(range(256))
    event = raw_event({
        "topic": "delay-in", "partition": 0, "offset": 1, "timestamp": 0, "timestampType": "CREATE_TIME",
        "headers": [{"chronosMessageId": signed(message_id.encode())}, GOOD_HEADERS[1],
                    {"trace-bin": signed(trace)}, {"nothing": None}, {"empty": []}],
    })
    response = enqueue_handler(event, FakeLambdaContext("delay_enqueue", 60_000))
    assert response == {"batchItemFailures": []}
    rows = {r.id: r for r in handler_service.store.ready(handler_service.node_id, timedelta(days=3650), 10)}
    assert set(rows) == {"good-0", message_id, "good-2"}
    assert rows[message_id].headers == (("trace-bin", trace), ("nothing", None), ("empty", b""))


def test_sample_event_file_is_accepted(handler_service: DelayService) -> None:
    event = json.loads((SAMPLE_EVENTS_DIR / "msk_delay_input.json").read_text())
    result = asdict(enqueue_function.enqueue(KafkaEvent(event), None))
    assert (result["received"], result["enqueued"], len(result["dropped"])) == (3, 2, 1)
    assert enqueue_handler(event, FakeLambdaContext("delay_enqueue", 60_000)) == {"batchItemFailures": []}
    rows = handler_service.store.ready(handler_service.node_id, timedelta(days=36500), 10)
    [tombstone] = [r for r in rows if r.id == "tombstone-1"]  # its signed and null header values
    assert tombstone.headers == (("trace-bin", b"\x00\x01\x7f\x80\xff"), ("tenant", None))


def test_crash_after_insert_before_offset_commit_stores_once(
    handler_service: DelayService, settings: DelaySettings, connections: Connections,
) -> None:
    ids = [f"r{i}" for i in range(20)]
    produce(connections.kafka_bootstrap, settings.input_topic,
            [{"value": b"v", "headers": chronos_headers(i, in_ms(60_000))} for i in ids])
    calls: list[dict[str, Any]] = []

    def crash_once(event: dict[str, Any], context: Any) -> Any:
        result = asdict(enqueue_function.enqueue(KafkaEvent(event), context))  # rows committed to Postgres...
        calls.append(result)
        if len(calls) == 1:
            raise RuntimeError("simulated crash before the offset commit")  # ...offsets not committed
        return result

    config = MskBridgeConfig(bootstrap=connections.kafka_bootstrap, topic=settings.input_topic,
                             group_id=settings.consumer_group, function_name="delay_enqueue", batch_size=100,
                             batching_window_ms=500, session_timeout_ms=2000, retry_backoff_ms=50)
    stop = threading.Event()
    thread = threading.Thread(target=MskBridge(config, crash_once).run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: sum(c["received"] for c in calls[1:]) >= sum(c["received"] for c in calls[:1]) > 0,
                 timeout=15, what="the batch delivered again")
    finally:
        stop.set()
        thread.join(10)
    assert sum(c["enqueued"] for c in calls) == 20  # the second delivery inserted nothing new
    assert handler_service.store.counts() == (20, 0)


def run_bridge(settings: DelaySettings, connections: Connections, handler: Any, done: Any) -> MskBridge:
    """The local MSK event source on the test's input topic, until ``done()``."""
    config = MskBridgeConfig(bootstrap=connections.kafka_bootstrap, topic=settings.input_topic,
                             group_id=settings.consumer_group, function_name="delay_enqueue", batch_size=100,
                             batching_window_ms=300, session_timeout_ms=2000, retry_backoff_ms=50)
    bridge = MskBridge(config, handler)
    stop = threading.Event()
    thread = threading.Thread(target=bridge.run, args=(stop,))
    thread.start()
    try:
        wait_for(done, timeout=20, what="the bridge to deliver")
    finally:
        stop.set()
        thread.join(10)
    return bridge


def test_non_ascii_id_binary_and_null_headers_through_the_bridge_end_to_end(
    settings: DelaySettings, connections: Connections, store: Any, output: OutputReader,
) -> None:
    """The local bridge sends signed bytes and nulls as Lambda does; the message comes out byte for byte."""
    from switchyard.local.delay_runtime import LocalRuntime

    message_id = "commande-№42-ключ-✓"
    trace = bytes(range(255, -1, -1))
    local = LocalRuntime(settings, connections)
    local.start()
    try:
        produce(connections.kafka_bootstrap, settings.input_topic, [{
            "key": b"\xffk", "value": b"\x80v",
            "headers": [*chronos_headers(message_id, in_ms(1500)), ("test-id", b"nonascii"),
                        ("trace-bin", trace), ("nothing", None), ("empty", b"")]}])
        assert output.wait_for_ids({"nonascii"}, timeout=15) == ["nonascii"]
    finally:
        local.join()
    [fired] = output.messages
    assert (fired.key(), fired.value()) == (b"\xffk", b"\x80v")
    assert fired.headers() == [("test-id", b"nonascii"), ("trace-bin", trace), ("nothing", None),
                               ("empty", b"")]


FLAKY_TRIGGER = """
CREATE TABLE {schema}.flaky_cured ();
CREATE FUNCTION {schema}.flaky() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id LIKE 'flaky%' AND NOT EXISTS (SELECT FROM {schema}.flaky_cured) THEN
        RAISE EXCEPTION 'simulated failure of one record' USING ERRCODE = {errcode};
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER flaky BEFORE INSERT ON {schema}.delayed_messages
    FOR EACH ROW EXECUTE FUNCTION {schema}.flaky();
"""


def fail_one_record(dsn: str, schema: str, errcode: str) -> None:
    """Make Postgres refuse rows with ids 'flaky...' with SQLSTATE ``errcode`` until ``cure``."""
    ddl = sql.SQL(FLAKY_TRIGGER).format(schema=sql.Identifier(schema), errcode=sql.Literal(errcode))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ddl)


def cure(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {}.flaky_cured DEFAULT VALUES").format(sql.Identifier(schema)))


def test_transient_store_failure_of_one_record_is_a_batch_item_failure_redelivered_and_stored(
    handler_service: DelayService, settings: DelaySettings, connections: Connections,
) -> None:
    ids = [f"t{i}" for i in range(4)] + ["flaky"] + [f"t{i}" for i in range(5, 10)]
    produce(connections.kafka_bootstrap, settings.input_topic,
            [{"value": b"v", "headers": chronos_headers(i, in_ms(60_000)), "partition": 0} for i in ids])
    # 55P03 lock_not_available: what a lock timeout raises. It lasts until the first invocation
    # answered; the redelivery succeeds.
    fail_one_record(connections.postgres_dsn, settings.schema, "55P03")
    calls: list[tuple[list[int], dict[str, Any], list[int]]] = []
    topic = settings.input_topic

    def recording(event: dict[str, Any], context: Any) -> Any:
        offsets = [r["offset"] for rs in event["records"].values() for r in rs]
        before = committed_offsets(connections.kafka_bootstrap, settings.consumer_group, topic)
        response = enqueue_handler(event, context)
        calls.append((offsets, response, before))
        if response["batchItemFailures"]:  # the same failure, as Powertools' batch utility names it
            cure(connections.postgres_dsn, settings.schema)
            assert response == process_partial_response(
                event=event, record_handler=fail_offset_4,
                processor=BatchProcessor(event_type=EventType.Kafka))
        return response

    bridge = run_bridge(settings, connections, recording,
                        lambda: handler_service.store.counts()[0] == 10 and len(calls) >= 2)
    first_offsets, first_response, _ = calls[0]
    assert first_offsets[:5] == [0, 1, 2, 3, 4]
    assert first_response == {"batchItemFailures": [
        {"itemIdentifier": {"partition": f"{topic}-0", "offset": 4}}]}
    second_offsets, second_response, committed_before = calls[1]
    assert committed_before[0] == 4  # offsets 0-3 were committed after the first invocation
    assert second_offsets[0] == 4 and second_response == {"batchItemFailures": []}  # redelivered from it
    assert (bridge.partial_failures, bridge.failures) == (1, 0)
    assert handler_service.store.existing_ids(ids) == set(ids)
    assert committed_offsets(connections.kafka_bootstrap, settings.consumer_group, topic)[0] == 10


def test_every_transiently_failing_record_of_a_batch_is_named_and_the_rest_stored(
    handler_service: DelayService, settings: DelaySettings, connections: Connections,
) -> None:
    fail_one_record(connections.postgres_dsn, settings.schema, "40P01")  # deadlock_detected
    ids = ["a", "flaky-1", "b", "c", "flaky-2", "d", "e", "f", "g"]
    event = msk_event([rec(i, 60_000) for i in ids])
    response = enqueue_handler(event, FakeLambdaContext("delay_enqueue", 60_000))
    assert response == {"batchItemFailures": [{"itemIdentifier": {"partition": "delay-in-0", "offset": o}}
                                              for o in (1, 4)]}
    assert handler_service.store.existing_ids(ids) == set(ids) - {"flaky-1", "flaky-2"}


def test_a_record_postgres_refuses_as_data_is_dropped_and_the_rest_is_stored(
    handler_service: DelayService, settings: DelaySettings, connections: Connections,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fail_one_record(connections.postgres_dsn, settings.schema, "22023")  # a data error, for good
    response = enqueue_handler(msk_event([rec("a", 60_000), rec("flaky", 60_000), rec("b", 60_000)]),
                               FakeLambdaContext("delay_enqueue", 60_000))
    assert response == {"batchItemFailures": []}
    assert handler_service.store.existing_ids(["a", "flaky", "b"]) == {"a", "b"}
    [log] = [r for r in caplog.records if getattr(r, "reason", None) == "unstorable"]
    assert log.levelname == "ERROR" and (log.topic, log.partition, log.offset) == ("delay-in", 0, 1)


def fail_offset_4(record: KafkaEventRecord) -> None:
    if record.offset == 4:
        raise RuntimeError("failed")


def test_a_dropped_record_is_logged_in_its_trace(handler_service: DelayService) -> None:
    """The drop's log line carries the record's trace id as its correlation id."""
    import io
    import logging

    from switchyard.core.observability import logger

    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{trace_id}-00f067aa0ba902b7-01".encode()
    bad = {"key": b"k", "value": b"bad",
           "headers": [("chronosMessageId", b"no-deadline"), ("traceparent", traceparent)]}
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(logger.registered_formatter)  # the lines as the logger writes them
    logger.addHandler(handler)
    try:
        outcome = invoke([bad, rec("fine", 60_000)])
    finally:
        logger.removeHandler(handler)
    assert outcome["enqueued"] == 1 and len(outcome["dropped"]) == 1
    [line] = [line for line in lines.getvalue().splitlines() if "dropped record" in line]
    assert f"correlation_id={trace_id}" in line
