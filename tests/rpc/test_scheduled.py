"""Scheduled calls: the relay from the delay scheduler's output into the pools, on the real RabbitMQ,
Postgres and Kafka, and the whole loop (schedule, fire, relay, worker, durable reply queue)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pika
import pytest

from switchyard.aws import services
from switchyard.core.config import Connections
from switchyard.delay.model import Drop, DropReason, InputRecord
from switchyard.delay.service import build_service as build_delay
from switchyard.delay.settings import DelaySettings
from switchyard.delay.store import PostgresDelayStore
from switchyard.local.delay_runtime import LocalRuntime
from switchyard.local.functions import load_function
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.rpc import RpcClient, protocol
from switchyard.rpc.client.schedule import collect, deadline_of, declare_reply_queue
from switchyard.rpc.control.publisher import ConfirmingPublisher
from switchyard.rpc.control.scheduled import relay_scheduled
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.scheduling import ScheduledCall, scheduled_headers
from switchyard.rpc.service import build_relay
from switchyard.rpc.settings import RpcSettings
from tests.conftest import blocked_in, unique, wait_for
from tests.delay.conftest import create_topics, delete_topics, msk_event
from tests.rpc.conftest import delete_pool, get_message

WHOAMI = "tests.rpc.handlers:whoami"


@pytest.fixture
def delay_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[DelaySettings]:
    """Unique topics and schema (the client reads the input topic from the environment, as deployed)."""
    name = unique("sched")
    s = DelaySettings(input_topic=f"{name}-in", output_topic=f"{name}-out", schema=name,
                      consumer_group=f"{name}-g", application_name=name, batch_window_ms=20)
    bootstrap = Connections.from_env().kafka_bootstrap
    create_topics(bootstrap, s.input_topic, s.output_topic)
    monkeypatch.setenv("SWITCHYARD_DELAY_INPUT_TOPIC", s.input_topic)
    yield s
    with PostgresDelayStore(Connections.from_env().postgres_dsn, s.schema) as dropping:
        dropping.drop_schema()
    delete_topics(bootstrap, s.input_topic, s.output_topic)


@pytest.fixture
def store(delay_settings: DelaySettings) -> Iterator[PostgresDelayStore]:
    st = PostgresDelayStore(Connections.from_env().postgres_dsn, delay_settings.schema, "sched-tests")
    st.migrate()
    yield st
    st.close()


@pytest.fixture
def publisher(pool: tuple[str, RpcSettings]) -> Iterator[ConfirmingPublisher]:
    pub = ConfirmingPublisher(pool[1].connections.amqp_url, "switchyard-scheduled-test")
    yield pub
    pub.close()


def fired(offset: int, call: ScheduledCall, *, drop: tuple[str, ...] = (),
          extra: tuple[tuple[str, bytes | None], ...] = ()) -> InputRecord:
    """A record as the scheduler relays it: the call's headers without the Chronos two."""
    headers = [(n, v) for n, v in scheduled_headers(call, datetime.now(UTC))
               if not n.startswith("chronos") and n not in drop]
    return InputRecord("out", 0, offset, call.key.encode(), call.body, (*headers, *extra))


def delete_queue(settings: RpcSettings, queue: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    connection.channel().queue_delete(queue)
    connection.close()


def test_calls_go_into_their_pool_and_refusals_are_parked_with_their_reason(
        pool, publisher, store) -> None:
    name, settings = pool
    reply = unique("r")
    queue = declare_reply_queue(settings, reply)
    try:
        now = int(time.time() * 1000)
        good = ScheduledCall("id-good", name, "fresh-key", b"hello", queue, now + 60_000)
        expired = ScheduledCall("id-late", name, "k2", b"late", queue, now - 1000)
        unknown = ScheduledCall("id-nopool", unique("nopool"), "k3", b"lost?")
        not_a_call = InputRecord("out", 0, 5, b"k", b"v", (("other", b"x"),))
        records = [
            fired(1, good, extra=(("traceparent", b"00-abc-def-01"),)),
            fired(2, expired),
            fired(3, unknown),
            fired(4, ScheduledCall("id-nokey", name, "k4", b"b"), drop=(protocol.KEY_HEADER,)),
            not_a_call,
            Drop("out", 0, 6, DropReason.MALFORMED_RECORD, "bad base64"),
        ]
        outcome = relay_scheduled(records, publisher=publisher, parked=store, now_ms=now)
        assert (outcome.records, outcome.published, outcome.without_pool) == (6, 1, 1)
        assert (outcome.expired, outcome.unknown_pool, outcome.malformed, outcome.parked) == (1, 1, 2, 4)
        assert outcome.failed == ()

        # A new key: the request exchange's alternate exchange takes it to the orphan path (cold start).
        got = get_message(settings, protocol.orphan_queue(name))
        assert got is not None
        _, props, body = got
        assert body == b"hello" and props.message_id == props.correlation_id == "id-good"
        assert props.reply_to == queue and props.headers[protocol.KEY_HEADER] == "fresh-key"
        assert props.headers["traceparent"] == "00-abc-def-01"

        poisoned = {}
        while (got := get_message(settings, protocol.poison_queue(name), timeout=1)) is not None:
            poisoned[got[1].message_id] = got[1].headers[protocol.POISON_REASON_HEADER]
        assert poisoned["id-late"].startswith("expired:")
        assert poisoned["out/0/4"].startswith("malformed:") and protocol.KEY_HEADER in poisoned["out/0/4"]
        answers = collect(settings, reply)
        assert answers["id-late"].status == protocol.Status.EXPIRED

        parked = {row[0]: row[3] for row in store.parked()}
        assert parked[unknown.id].startswith("unknown_pool:")
        assert parked["out/0/6"].startswith("malformed:")
    finally:
        delete_queue(settings, queue)


def test_a_broker_that_is_not_there_fails_the_records_for_redelivery(pool, store) -> None:
    name, _ = pool
    down = ConfirmingPublisher("amqp://guest:guest@127.0.0.1:1/%2F", "down")
    outcome = relay_scheduled([fired(7, ScheduledCall("id-x", name, "k", b""))], publisher=down,
                              parked=store, now_ms=int(time.time() * 1000))
    assert outcome.publish_failures == 1 and [f.offset for f in outcome.failed] == [7]
    assert outcome.published == outcome.parked == 0


def test_handler_answers_a_partial_batch_response(pool, delay_settings, store, monkeypatch) -> None:
    """The Lambda handler itself: a failed record is named, the others settle."""
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    name, settings = pool
    svc = build_delay(delay_settings, Connections.from_env())
    relay = build_relay(settings, parked=svc.store)
    services.scheduled_relay.install(relay)
    try:
        call = ScheduledCall("id-h", name, "hk", b"body")
        records = [{"key": b"hk", "value": b"body", "headers": fired(0, call).headers}, {"value": b"x"}]
        event = msk_event(records,
                          topic=delay_settings.output_topic)
        next(iter(event["records"].values()))[1]["headers"] = [{"x": "not bytes"}]  # unreadable: parked
        handler = load_function("rpc_scheduled").lambda_handler
        response = handler(event, FakeLambdaContext("rpc_scheduled", 60_000))
        assert response == {"batchItemFailures": []}
        got = get_message(settings, protocol.orphan_queue(name))
        assert got is not None and got[1].message_id == "id-h"
    finally:
        services.scheduled_relay.install(None)
        relay.close()
        svc.close()


def test_deadline_forms() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert deadline_of(5, now) == now + timedelta(seconds=5)
    assert deadline_of("2026-01-01T00:00:10Z", now) == now + timedelta(seconds=10)
    assert deadline_of(datetime(2026, 1, 1, 0, 0, 3), now) == now + timedelta(seconds=3)
    with pytest.raises(TypeError):
        deadline_of(True, now)
    with pytest.raises(protocol.InvalidNameError):
        protocol.reply_queue("a/b")


def test_scheduled_calls_run_at_their_time_and_answer_into_a_durable_queue(
        make_pool, planes, delay_settings) -> None:
    """Client -> delay input -> scheduler -> output -> relay -> pool (cold start) -> worker -> reply
    queue, read back by a new client (as after a restart)."""
    name, settings = make_pool()
    planes.start(name, settings, handler=WHOAMI)
    runtime = LocalRuntime(delay_settings, Connections.from_env(), roles=("enqueue", "fire", "scheduled"))
    runtime.start()
    reply = unique("r")
    try:
        with RpcClient(name, settings) as client:
            started = time.time()
            ids = {client.schedule("later", f"in {s}", at=s, reply=reply).result(30): s for s in (2, 3)}
            ids[client.schedule("now", "past", at=-60, reply=reply).result(30)] = 0
            client.schedule("later", "no answer wanted", at=1).result(30)
        first = get_message(settings, protocol.reply_queue(reply), timeout=30, keep=True)
        assert first is not None and first[1].delivery_mode == 2  # persistent, as its queue is durable
        with RpcClient(name, settings) as fresh:
            answers = fresh.collect(reply, ids, timeout=60)
        assert set(answers) == set(ids)
        assert all(answer.ok for answer in answers.values())
        assert answers[min(ids, key=ids.get)].text().endswith("|now|past")
        assert time.time() - started >= 3
        assert json.dumps(sorted(a.text().split("|", 1)[1] for a in answers.values())) == json.dumps(
            ["later|in 2", "later|in 3", "now|past"])
    finally:
        runtime.join()
        delete_queue(settings, protocol.reply_queue(reply))


def test_a_call_parked_for_a_pool_not_there_yet_is_answered_once_replayed(
        make_pool, planes, delay_settings, store, publisher) -> None:
    """`switchyard delay replay` after the pool is created: the parked record fires again with its
    headers, the relay takes it into the pool, and its answer reaches the reply queue."""
    name, settings = make_pool()
    delete_pool(settings, name)  # not created yet when the call fires
    reply = unique("r")
    queue = declare_reply_queue(settings, reply)
    runtime = LocalRuntime(delay_settings, Connections.from_env(), roles=("fire", "scheduled"))
    try:
        call = ScheduledCall("id-early", name, "k", b"hello", queue)
        outcome = relay_scheduled([fired(1, call)], publisher=publisher, parked=store,
                                  now_ms=int(time.time() * 1000))
        assert (outcome.unknown_pool, outcome.parked, outcome.published) == (1, 1, 0)
        with PoolTopology(name, settings) as topology:
            topology.declare()
        planes.start(name, settings, handler=WHOAMI)
        assert store.replay_parked(None, 10) == ["id-early"] and store.parked() == []
        runtime.start()
        answers = collect(settings, reply, ["id-early"], timeout=60)
        assert answers["id-early"].ok and answers["id-early"].text().endswith("|k|hello")
        assert store.parked() == []
    finally:
        runtime.join()
        delete_queue(settings, queue)


def test_a_crash_after_publishing_before_the_commit_gives_a_duplicate_never_a_loss(
        pool, delay_settings, store, monkeypatch) -> None:
    """The relay's invocation dies after its publish was confirmed, before the mapping committed the
    offset: the record comes again and is published again, with the same message id."""
    import threading

    from confluent_kafka import Producer

    from switchyard.local.msk_bridge import MskBridge, MskBridgeConfig

    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    name, settings = pool
    relay = build_relay(settings, parked=store)
    services.scheduled_relay.install(relay)
    bootstrap = Connections.from_env().kafka_bootstrap
    producer = Producer({"bootstrap.servers": bootstrap})
    record = fired(0, ScheduledCall("id-crash", name, "crash-key", b"once"))
    producer.produce(delay_settings.output_topic, key=record.key, value=record.value,
                     headers=list(record.headers))
    producer.flush(10)
    handler = load_function("rpc_scheduled").lambda_handler
    crashes = []

    def crash_once(event: dict, context: object) -> object:
        response = handler(event, context)  # published and confirmed
        if not crashes:
            crashes.append(response)
            raise RuntimeError("the invocation died before the mapping committed (test)")
        return response

    bridge = MskBridge(MskBridgeConfig(bootstrap, delay_settings.output_topic, unique("g"), "rpc_scheduled",
                                       batching_window_ms=5, retry_backoff_ms=10, fetch_min_bytes=1),
                       crash_once)
    stop = threading.Event()
    thread = threading.Thread(target=bridge.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: bridge.invocations >= 2, timeout=60, interval=0.05, required=False)
    finally:
        stop.set()
        thread.join(30)
        services.scheduled_relay.install(None)
        relay.close()
    assert crashes and bridge.failures == 1 and bridge.invocations == 2
    copies = []
    while (got := get_message(settings, protocol.orphan_queue(name), timeout=2)) is not None:
        copies.append((got[1].message_id, got[2]))
    assert copies == [("id-crash", b"once"), ("id-crash", b"once")]


def test_call_at_and_collect_on_the_command_line(make_pool, planes, delay_settings) -> None:
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    name, settings = make_pool()
    planes.start(name, settings, handler=WHOAMI)
    runtime = LocalRuntime(delay_settings, Connections.from_env(), roles=("enqueue", "fire", "scheduled"))
    runtime.start()
    reply = unique("r")

    def switchyard(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "switchyard", *args], capture_output=True, text=True,
                              env=subprocess_env(SWITCHYARD_DELAY_INPUT_TOPIC=delay_settings.input_topic),
                              timeout=120)

    try:
        scheduled = switchyard("call", "--pool", name, "--key", "cli", "--body", "later", "--at", "+1s",
                               "--reply-queue", reply, "--json")
        assert scheduled.returncode == 0, scheduled.stderr
        call = json.loads(scheduled.stdout)
        assert call["status"] == "scheduled" and call["reply_queue"] == reply
        collected = switchyard("collect", "--reply-queue", reply, "--id", call["id"], "--timeout", "60",
                               "--json")
        assert collected.returncode == 0, collected.stderr
        (answer,) = json.loads(collected.stdout)
        assert (answer["id"], answer["status"]) == (call["id"], "ok")
        assert answer["body"].endswith("|cli|later")
        bad = switchyard("call", "--pool", name, "--key", "k", "--at", "tomorrow")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "+5s" in bad.stderr
    finally:
        runtime.join()
        delete_queue(settings, protocol.reply_queue(reply))


def test_a_scheduled_call_carries_its_trace_into_the_record() -> None:
    """The call's own traceparent, else the request in hand's (a child), else a new trace."""
    from datetime import UTC, datetime

    from switchyard.core import tracing
    from switchyard.rpc.scheduling import ScheduledCall, scheduled_headers

    given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    def traceparents(call: ScheduledCall) -> list[bytes]:
        return [v for n, v in scheduled_headers(call, datetime.now(UTC)) if n == tracing.TRACEPARENT_HEADER]

    own = ScheduledCall("c1", "p", "k", b"", headers=((tracing.TRACEPARENT_HEADER, given.encode()),))
    assert traceparents(own) == [given.encode()]
    context = tracing.new_trace()
    with tracing.scope(context):
        (inherited,) = traceparents(ScheduledCall("c2", "p", "k", b""))
    assert tracing.parse(inherited).trace_id == context.trace_id
    (fresh,) = traceparents(ScheduledCall("c3", "p", "k", b""))
    assert tracing.parse(fresh).trace_id not in (context.trace_id, given.split("-")[1])


# -- what AMQP cannot carry (issue 34, item 2) ---------------------------------------------------
EMOJI = "\U0001f600"
UNCARRIABLE = {  # a shape a plain Kafka producer can write that no AMQP message can carry
    "call id of 400 bytes": dict(call_id=EMOJI * 100),
    "header name of 300 bytes": dict(extra=(("h" * 300, b"v"),)),
    "header value of 200 KB": dict(extra=(("big", b"x" * 200_000),)),
    "deadline ms of 2**63": dict(extra=((protocol.DEADLINE_HEADER, str(2**63).encode()),)),
}


def taken(settings: RpcSettings, queue: str) -> dict[str, str | None]:
    """Every message of ``queue``, taken: message id -> poison reason."""
    found = {}
    while (got := get_message(settings, queue, timeout=0.5)) is not None:
        found[got[1].message_id] = (got[1].headers or {}).get(protocol.POISON_REASON_HEADER)
    return found


@pytest.mark.parametrize("shape", UNCARRIABLE)
def test_a_record_amqp_cannot_carry_is_parked_alone_and_the_calls_behind_it_go_on(
        pool, publisher, store, shape) -> None:
    name, settings = pool
    bad = UNCARRIABLE[shape]
    odd = ScheduledCall(bad.get("call_id", "bad-11"), name, "k11", b"b")
    records = [fired(10, ScheduledCall("good-10", name, "k10", b"a")),
               fired(11, odd, extra=bad.get("extra", ())),
               fired(12, ScheduledCall("good-12", name, "k12", b"c"))]
    outcome = relay_scheduled(records, publisher=publisher, parked=store, now_ms=int(time.time() * 1000))
    assert outcome.failed == (), f"failed offsets {[f.offset for f in outcome.failed]}"
    assert (outcome.published, outcome.malformed, outcome.parked) == (2, 1, 1)
    assert set(taken(settings, protocol.orphan_queue(name))) == {"good-10", "good-12"}
    reasons = [reason for reason in taken(settings, protocol.poison_queue(name)).values()]
    reasons += [row[3] for row in store.parked()]
    assert len(reasons) == 1 and reasons[0].startswith("malformed:") and "\n" not in reasons[0], reasons
    # the publisher's connection survived: the next batch goes through on it
    again = relay_scheduled([fired(13, ScheduledCall("good-13", name, "k13", b"d"))], publisher=publisher,
                            parked=store, now_ms=int(time.time() * 1000))
    assert again.published == 1 and again.failed == ()


def test_a_scheduled_call_amqp_cannot_carry_is_refused_by_the_client(pool, delay_settings) -> None:
    name, settings = pool
    with RpcClient(name, settings) as client:
        with pytest.raises(protocol.InvalidNameError, match="255 bytes") as refused:
            client.schedule("k", call_id=EMOJI * 100)
        assert "\n" not in str(refused.value)
        with pytest.raises(ValueError, match="expiration_ms") as refused:
            client.schedule("k", expiration_ms=2**63)
        assert "\n" not in str(refused.value)
        assert client.schedule("k", call_id=EMOJI * 63).result(30) == EMOJI * 63  # 252 bytes: carried


def test_the_handler_fails_no_good_offset_for_records_amqp_cannot_carry(
        pool, delay_settings, store, monkeypatch) -> None:
    """The Lambda handler on an MSK event: every bad shape between good calls, one batch."""
    name, settings = pool
    svc = build_delay(delay_settings, Connections.from_env())
    relay = build_relay(settings, parked=svc.store)
    services.scheduled_relay.install(relay)
    records = [fired(0, ScheduledCall("good-0", name, "k0", b"a"))]
    for n, bad in enumerate(UNCARRIABLE.values(), start=1):
        records.append(fired(2 * n - 1, ScheduledCall(bad.get("call_id", f"bad-{n}"), name, f"b{n}", b"b"),
                             extra=bad.get("extra", ())))
        records.append(fired(2 * n, ScheduledCall(f"good-{2 * n}", name, f"k{2 * n}", b"c")))
    event = msk_event([{"key": r.key, "value": r.value, "headers": r.headers} for r in records],
                      topic=delay_settings.output_topic)
    try:
        handler = load_function("rpc_scheduled").lambda_handler
        assert handler(event, FakeLambdaContext("rpc_scheduled", 60_000)) == {"batchItemFailures": []}
        good = {f"good-{2 * n}" for n in range(len(UNCARRIABLE) + 1)}
        assert set(taken(settings, protocol.orphan_queue(name))) == good
        assert len(taken(settings, protocol.poison_queue(name))) + len(store.parked()) == len(UNCARRIABLE)
    finally:
        services.scheduled_relay.install(None)
        relay.close()
        svc.close()


# -- collect (issue 34, item 10) ------------------------------------------------------------------
@pytest.fixture
def reply_queue() -> Iterator[tuple[RpcSettings, str]]:
    settings = RpcSettings.from_env()
    reply = unique("r")
    queue = declare_reply_queue(settings, reply)
    yield settings, reply
    delete_queue(settings, queue)


def answer(channel, queue: str, call_id: str) -> None:
    channel.basic_publish("", queue, b"{}", pika.BasicProperties(correlation_id=call_id,
                                                                 headers={protocol.STATUS_HEADER: "ok"}))


def test_collect_returns_near_its_timeout_with_many_answers_for_other_ids_queued(reply_queue) -> None:
    settings, reply = reply_queue
    queue = protocol.reply_queue(reply)
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    channel = connection.channel()
    answer(channel, queue, "mine")
    for n in range(30_000):
        answer(channel, queue, f"other-{n}")
    wait_for(lambda: channel.queue_declare(queue, passive=True).method.message_count == 30_001,
             timeout=30, what="30,001 answers queued")
    connection.close()
    started = time.monotonic()
    found = collect(settings, reply, ["mine", "absent"], timeout=1)
    took = time.monotonic() - started
    assert set(found) == {"mine"}
    assert took < 2.0, f"collect(timeout=1) took {took:.1f} s"
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    left = connection.channel().queue_declare(queue, passive=True).method.message_count
    connection.close()
    assert left == 30_000  # the others stay for their own collectors


def test_a_second_collector_of_a_reply_queue_finds_its_answer_while_another_waits(reply_queue) -> None:
    import threading

    settings, reply = reply_queue
    queue = protocol.reply_queue(reply)
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    answer(connection.channel(), queue, "b")
    connection.close()
    first: dict[str, object] = {}
    waiting = threading.Thread(target=lambda: first.update(collect(settings, reply, ["a"], timeout=8)))
    waiting.start()
    try:
        wait_for(lambda: blocked_in(waiting, "collect", "sleep"), interval=0.005,  # (it put "b" back first)
                 what='the first collector to pass over "b" and wait for "a"')
        started = time.monotonic()
        second = collect(settings, reply, ["b"], timeout=3)
        took = time.monotonic() - started
        assert set(second) == {"b"}, f"the second collector found nothing in {took:.1f} s"
        connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
        answer(connection.channel(), queue, "a")
        connection.close()
    finally:
        waiting.join(15)
    assert set(first) == {"a"}


# -- scheduled calls and traces (issue 34, item 11) ----------------------------------------------
TRACED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_relays_expired_answer_carries_the_calls_trace(pool, publisher, store) -> None:
    from switchyard.core import tracing

    name, settings = pool
    reply = unique("r")
    queue = declare_reply_queue(settings, reply)
    try:
        now = int(time.time() * 1000)
        late = ScheduledCall("id-late-traced", name, "k", b"late", queue, now - 1000,
                             headers=((tracing.TRACEPARENT_HEADER, TRACED.encode()),))
        outcome = relay_scheduled([fired(1, late)], publisher=publisher, parked=store, now_ms=now)
        assert outcome.expired == 1 and outcome.failed == ()
        got = collect(settings, reply, ["id-late-traced"], timeout=10)["id-late-traced"]
        assert got.status == protocol.Status.EXPIRED
        context = tracing.parse(got.headers.get(tracing.TRACEPARENT_HEADER))
        assert context is not None, f"no traceparent on the expired answer: {got.headers}"
        assert context.trace_id == tracing.parse(TRACED).trace_id and context.span_id != "00f067aa0ba902b7"
    finally:
        delete_queue(settings, queue)


class WarmPoolPublisher(ConfirmingPublisher):
    """The real publisher; a warm group's worker handles the call before the confirm is back, so its
    ``handled`` hop is written while the relay still waits: written here at that moment."""

    def publish_settled(self, messages, timeout=30.0):
        results = super().publish_settled(messages, timeout)
        from switchyard.core import tracing

        for message in messages:
            context = tracing.parse(message.properties.headers.get(tracing.TRACEPARENT_HEADER))
            tracing.hop(context.child() if context else None, "rpc", "handled", key="k")
        return results


def test_switchyard_trace_lists_the_relays_publish_before_a_warm_workers_answer(
        pool, store, tmp_path, monkeypatch, capsys) -> None:
    from switchyard import cli
    from switchyard.core import tracing

    name, settings = pool
    log = tmp_path / "trace.jsonl"
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(log))
    publisher = WarmPoolPublisher(settings.connections.amqp_url, "switchyard-scheduled-test")
    try:
        traced = ((tracing.TRACEPARENT_HEADER, TRACED.encode()),)
        call = ScheduledCall("id-warm", name, "k", b"", headers=traced)
        outcome = relay_scheduled([fired(1, call)], publisher=publisher, parked=store,
                                  now_ms=int(time.time() * 1000))
        assert outcome.published == 1
    finally:
        publisher.close()
    trace_id = tracing.parse(TRACED).trace_id
    events = [hop["event"] for hop in tracing.read_hops(trace_id, str(log))]
    assert events == ["scheduled call published", "handled"], events
    capsys.readouterr()
    assert cli.main(["trace", trace_id, "--log", str(log)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("rpc: ")[1].split()[0] for line in lines[1:]] == ["scheduled", "handled"], lines
