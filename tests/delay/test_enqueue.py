"""The enqueue Lambda handler with real Postgres and Kafka: dedup, late messages, bad headers."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest

from switchyard.config import Connections
from switchyard.delay import runtime
from switchyard.delay.model import DEADLINE_HEADER, MESSAGE_ID_HEADER
from switchyard.delay.runtime import DelayService
from switchyard.delay.settings import DelaySettings
from switchyard.local.functions import FUNCTIONS_DIR
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.local.msk_bridge import MskBridge, MskBridgeConfig
from tests.conftest import wait_for
from tests.delay.conftest import OutputReader, chronos_headers, in_ms, msk_event, produce

enqueue_handler = runtime.load_function("enqueue").lambda_handler


def invoke(records: list[dict[str, Any]]) -> dict[str, Any]:
    return enqueue_handler(msk_event(records), FakeLambdaContext("delay_enqueue", 60_000))


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
    result = invoke([rec("before", 60_000), {"key": b"k", "value": b"bad", "headers": headers},
                     rec("after", 60_000)])
    assert result["enqueued"] == 2 and handler_service.store.counts() == (2, 0)
    [drop] = result["dropped"]
    assert (drop["topic"], drop["partition"], drop["offset"], drop["reason"]) == ("delay-in", 0, 1, reason)
    [log] = [r for r in caplog.records if getattr(r, "reason", None) == reason]
    assert log.levelname == "ERROR" and "delay-in/0/1" in log.getMessage()
    assert (log.topic, log.partition, log.offset) == ("delay-in", 0, 1)
    out = capsys.readouterr().out
    emf = [json.loads(line) for line in out.splitlines() if '"DelayRecordsDropped"' in line]
    assert (emf and emf[-1]["DelayRecordsDropped"] == [1.0]) or emf[-1]["DelayRecordsDropped"] == 1.0


def test_sample_event_file_is_accepted(handler_service: DelayService) -> None:
    event = json.loads((FUNCTIONS_DIR.parent / "events/msk_delay_input.json").read_text())
    result = enqueue_handler(event, FakeLambdaContext("delay_enqueue", 60_000))
    assert (result["received"], result["enqueued"], len(result["dropped"])) == (3, 2, 1)


def test_crash_after_insert_before_offset_commit_stores_once(
    handler_service: DelayService, settings: DelaySettings, connections: Connections,
) -> None:
    ids = [f"r{i}" for i in range(20)]
    produce(connections.kafka_bootstrap, settings.input_topic,
            [{"value": b"v", "headers": chronos_headers(i, in_ms(60_000))} for i in ids])
    calls: list[dict[str, Any]] = []

    def crash_once(event: dict[str, Any], context: Any) -> Any:
        result = enqueue_handler(event, context)  # rows committed to Postgres...
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
