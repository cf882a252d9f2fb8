"""The Lambda handlers fed malformed messages: they keep going, count, and lose nothing else.

The handlers of ``functions/`` are called directly with ``aws:rmq`` events (built by the bridge's
own ``build_rmq_event`` or by hand) and a fake context, against a control plane installed for a
throwaway pool on the real RabbitMQ and Redis.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pika
import pytest
import redis

from switchyard.aws import services
from switchyard.core import tracing
from switchyard.core.errors import MalformedEventError
from switchyard.local.functions import load_function
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.local.rmq_bridge import RmqDelivery, build_rmq_event, rmq_message
from switchyard.rpc import protocol
from switchyard.rpc.drivers import NoopDriver
from switchyard.rpc.service import ControlPlane
from switchyard.rpc.settings import ControlSettings, Delays
from switchyard.rpc.store import GroupStatus, PoolState
from tests.conftest import wait_for
from tests.rpc.conftest import drain, flush_pool_state

ODD_KEYS = ["", "#", "🚂💨", "k" * 1024, "a key", "*"]


class Env:
    def __init__(self, pool: str, settings, plane: ControlPlane) -> None:
        self.pool = pool
        self.settings = settings
        self.plane = plane
        self.state: PoolState = plane.state
        self.connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
        self.channel = self.connection.channel()
        self.reply_queue = self.channel.queue_declare("", exclusive=True).method.queue

    def call(self, function: str, event: dict[str, Any]) -> dict[str, Any]:
        handler = load_function(function).lambda_handler
        return handler(event, FakeLambdaContext(function, 60_000))

    def replies(self, expected: int, timeout: float = 10.0) -> list[tuple[pika.BasicProperties, bytes]]:
        got: list[tuple[pika.BasicProperties, bytes]] = []

        def arrived() -> bool:
            got.extend(self.drain(self.reply_queue))
            return len(got) >= expected

        wait_for(arrived, timeout=timeout, what=f"{expected} replies")
        return got

    def replies_with(self, correlation_ids: set[str], timeout: float = 10.0) -> list:
        """Replies from the reply queue until every one of ``correlation_ids`` has come."""
        got: list[tuple[pika.BasicProperties, bytes]] = []

        def arrived() -> bool:
            got.extend(self.drain(self.reply_queue))
            return correlation_ids <= {props.correlation_id for props, _ in got}

        wait_for(arrived, timeout=timeout, what=f"replies {sorted(correlation_ids)}")
        return got

    def drain(self, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
        return drain(self.channel, queue)


@pytest.fixture
def env(pool, redis_client: redis.Redis) -> Iterator[Env]:
    name, settings = pool
    plane = ControlPlane(ControlSettings(name, Delays(30, 30)), settings, NoopDriver(), redis_client)
    services.control_plane.install(plane)
    e = Env(name, settings, plane)
    try:
        yield e
    finally:
        services.control_plane.install(None)
        plane.close()
        e.connection.close()
        flush_pool_state(redis_client, name)


def request(key: str | None, body: bytes = b"x", *, reply_to: str | None = None, correlation_id: str = "c",
            headers: dict[str, Any] | None = None) -> RmqDelivery:
    hdrs = dict(headers or {})
    if key is not None:
        hdrs[protocol.KEY_HEADER] = key
    props = pika.BasicProperties(reply_to=reply_to, correlation_id=correlation_id, headers=hdrs,
                                 delivery_mode=2, content_type="application/octet-stream")
    return RmqDelivery(body, props)


def event_of(queue: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    event = build_rmq_event(queue, "/", [])
    event["rmqMessagesByQueue"][f"{queue}::/"] = messages
    return event


def garbage_messages() -> list[dict[str, Any]]:
    """Hand-made ``aws:rmq`` messages no real mapping should send, but a handler must survive."""
    good_props = rmq_message(request("g"))["basicProperties"]
    return [
        {"data": base64.b64encode(b"no props").decode()},  # basicProperties missing
        {"basicProperties": None, "data": "", "redelivered": False},
        {"basicProperties": "nonsense", "data": "aGk="},
        {"basicProperties": {**good_props}, "data": "%%% not base64 %%%"},
        {"basicProperties": {**good_props, "headers": "not a table"}, "data": ""},
        {"basicProperties": {**good_props, "headers": None}, "data": ""},
        {"basicProperties": {**good_props, "headers": {protocol.KEY_HEADER: 42}}, "data": ""},
        {"basicProperties": {**good_props, "headers": {protocol.KEY_HEADER: {"bytes": [255, 254]}}},
         "data": ""},
        {"basicProperties": {**good_props, "headers": {protocol.KEY_HEADER: {"bytes": "oops"}}}, "data": ""},
        {"basicProperties": {**good_props, "headers": {protocol.KEY_HEADER: [1, 2]}}, "data": ""},
        {"basicProperties": {**good_props, "headers": {protocol.KEY_HEADER: None}}, "data": ""},
        {"basicProperties": {**good_props, "timestamp": "yesterday-ish", "deliveryMode": "two",
                             "priority": "high", "headers": {}}, "data": ""},
        "not even a dict",
    ]


def hostile_messages(key: str, reply_to: str) -> list[dict[str, Any]]:
    """Messages whose fields RabbitMQ would never deliver and pika cannot (or must not) re-publish."""
    base = rmq_message(request(key, reply_to=reply_to))["basicProperties"]
    return [
        {"basicProperties": {**base, "correlationId": 12345}, "data": ""},
        {"basicProperties": {**base, "replyTo": {"bytes": [1, 2]}}, "data": ""},
        {"basicProperties": {**base, "replyTo": "r" * 300}, "data": ""},
        {"basicProperties": {**base, "expiration": "soon"}, "data": ""},
        {"basicProperties": {**base, "priority": 1000}, "data": ""},
        {"basicProperties": {**base, "headers": {**base["headers"], "huge": 10**30}}, "data": ""},
        {"basicProperties": {**base, "headers": {**base["headers"], "s": "\ud800"}}, "data": ""},
        {"basicProperties": {**base, "headers": {protocol.KEY_HEADER: "\ud800"}}, "data": ""},
        {"basicProperties": {**base, "headers": {**base["headers"], "x-first-death-queue": {"bytes": [255]},
                                                 "x-first-death-reason": {"bytes": list(b"expired")}}},
         "data": ""},
    ]


# -- orphans ----------------------------------------------------------------------------------------
def test_orphan_handler_survives_garbage_and_forwards_the_good(env: Env) -> None:
    good = [request(key, f"body {i}".encode(), reply_to=env.reply_queue, correlation_id=f"good-{i}")
            for i, key in enumerate(ODD_KEYS)]
    big = request("big", b"B" * (1024 * 1024), correlation_id="big")
    empty = request("empty", b"", correlation_id="empty")
    lost_key = request(None, b"who am I", reply_to=env.reply_queue, correlation_id="no-key")
    no_reply = request("fire-and-forget", b"f", correlation_id="ff")
    messages = [rmq_message(d) for d in (*good, big, empty, lost_key, no_reply)]
    garbage = garbage_messages()
    outcome = env.call("rpc_orphans", event_of(protocol.orphan_queue(env.pool), [*garbage, *messages]))

    # Of the garbage only the bad-base64 one carries a key ("g"): it is forwarded as it came.
    without_key = len(garbage) - 1 + 1  # + the keyless request
    assert outcome["orphans"] == len(garbage) + len(messages)
    assert outcome["forwarded"] == len(good) + 4  # + big, empty, fire-and-forget, "g"
    assert outcome["without_key"] == without_key
    assert outcome["malformed_fields"] >= 6
    assert outcome["keys"] == len(ODD_KEYS) + 4

    # Every good request sits in its own bound queue, body and properties intact.
    for i, key in enumerate(ODD_KEYS):
        got = env.drain(protocol.request_queue(env.pool, key))
        assert [(props.correlation_id, body) for props, body in got] == [(f"good-{i}", f"body {i}".encode())]
        assert got[0][0].headers[protocol.KEY_HEADER] == key and got[0][0].reply_to == env.reply_queue
        assert env.state.get(key).status is GroupStatus.ACTIVE
    assert [b for _, b in env.drain(protocol.request_queue(env.pool, "big"))] == [b"B" * (1024 * 1024)]
    assert [b for _, b in env.drain(protocol.request_queue(env.pool, "empty"))] == [b""]
    assert [b for _, b in env.drain(protocol.request_queue(env.pool, "fire-and-forget"))] == [b"f"]

    # The keyless request got a negative response and went to the poison inventory with the rest.
    (props, body), = env.replies(1)
    assert props.correlation_id == "no-key" and props.headers[protocol.STATUS_HEADER] == protocol.Status.ERROR
    assert json.loads(body)["error"] == "MissingKey"
    poisoned = env.drain(protocol.poison_queue(env.pool))
    assert len(poisoned) == without_key
    assert all(props.headers[protocol.POISON_REASON_HEADER] for props, _ in poisoned)
    assert b"who am I" in [body for _, body in poisoned]


def test_orphan_handler_survives_fields_pika_cannot_publish(env: Env) -> None:
    good = request("ok", b"fine", reply_to=env.reply_queue, correlation_id="fine")
    event = event_of(protocol.orphan_queue(env.pool),
                     [*hostile_messages("h", env.reply_queue), rmq_message(good)])
    outcome = env.call("rpc_orphans", event)
    assert outcome["orphans"] == 10
    assert outcome["malformed_fields"] >= 8
    assert [(props.correlation_id, body)
            for props, body in env.drain(protocol.request_queue(env.pool, "ok"))] == [("fine", b"fine")]
    forwarded_h = env.drain(protocol.request_queue(env.pool, "h"))
    poisoned = env.drain(protocol.poison_queue(env.pool))
    assert outcome["forwarded"] == 1 + len(forwarded_h)
    assert len(forwarded_h) + len(poisoned) == 9  # nothing vanished


# -- dead letters -----------------------------------------------------------------------------------
def dead(key: str | None, reason: str | None, correlation_id: str, reply_to: str | None) -> RmqDelivery:
    headers: dict[str, Any] = {}
    if reason is not None:
        headers["x-first-death-reason"] = reason
        headers["x-first-death-queue"] = "q"
        headers["x-death"] = [{"reason": reason, "queue": "q", "count": 1, "exchange": "x",
                               "routing-keys": [key or ""]}]
    return request(key, b"dl", reply_to=reply_to, correlation_id=correlation_id, headers=headers)


def test_dead_letter_handler_survives_garbage_and_answers_the_good(env: Env) -> None:
    rq = env.reply_queue
    good = [dead("k1", "expired", "e1", rq), dead("", "delivery_limit", "d1", rq),
            dead("🚂", "maxlen", "m1", rq), dead("k" * 1024, "rejected", "r1", rq)]
    only_x_death = request("k2", b"dl", reply_to=rq, correlation_id="xd",
                           headers={"x-death": [{"reason": "expired", "queue": "q", "count": 1}]})
    no_reason = dead("k3", None, "nr", rq)
    no_reply = dead("k4", "expired", "nrt", None)
    big = RmqDelivery(b"B" * (1024 * 1024), dead("k5", "expired", "big", rq).properties)
    messages = [rmq_message(d) for d in (*good, only_x_death, no_reason, no_reply, big)]
    garbage = garbage_messages()
    hostile = hostile_messages("h", rq)
    outcome = env.call("rpc_dead_letters",
                       event_of(protocol.dl_queue(env.pool), [*garbage, *hostile, *messages]))

    assert outcome["dead_letters"] == len(garbage) + len(hostile) + len(messages)
    assert outcome["without_reply_to"] >= 1 and outcome["without_reason"] >= 1
    assert outcome["malformed_fields"] >= 8
    assert outcome["poisoned"] == 1
    # Per reason: e1, xd, big, nrt (no reply-to, still counted) and the hostile one expired; d1; r1; m1.
    per_reason = (outcome["expired"], outcome["delivery_limit"], outcome["rejected"], outcome["maxlen"])
    assert per_reason == (5, 1, 1, 1)
    expected = {"e1": "expired", "d1": "delivery_limit", "m1": "maxlen", "r1": "rejected", "xd": "expired",
                "nr": "dead_lettered", "big": "expired"}
    replies = env.replies_with(set(expected))
    statuses = {props.correlation_id: props.headers[protocol.STATUS_HEADER] for props, _ in replies}
    assert {cid: statuses.get(cid) for cid in expected} == expected
    detail = json.loads(next(body for props, body in replies if props.correlation_id == "e1"))
    assert detail["reason"] == "expired" and detail["key"] == "k1"
    poisoned = env.drain(protocol.poison_queue(env.pool))
    assert [props.correlation_id for props, _ in poisoned] == ["d1"]
    assert poisoned[0][0].headers["x-first-death-reason"] == "delivery_limit"


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_orphan_path_and_the_dead_letter_responder_keep_the_trace(env: Env) -> None:
    """Forwarded, answered expired, dead-lettered, poisoned: each copy or answer stays in the trace
    (the control plane's own span under the request's); a malformed traceparent starts a new one."""
    rq, trace_id = env.reply_queue, TRACE.split("-")[1]
    traced = {tracing.TRACEPARENT_HEADER: TRACE}
    orphans = [request("tk", b"fwd", reply_to=rq, correlation_id="f1", headers=traced),
               request("tk", b"bad", reply_to=rq, correlation_id="f2",
                       headers={tracing.TRACEPARENT_HEADER: "00-" + "x" * 500}),
               request(None, b"nokey", reply_to=rq, correlation_id="n1", headers=traced)]
    outcome = env.call("rpc_orphans",
                       event_of(protocol.orphan_queue(env.pool), [rmq_message(o) for o in orphans]))
    assert outcome["forwarded"] == 2 and outcome["without_key"] == 1
    forwarded = {props.correlation_id: tracing.parse(props.headers[tracing.TRACEPARENT_HEADER])
                 for props, _ in env.drain(protocol.request_queue(env.pool, "tk"))}
    assert forwarded["f1"].trace_id == trace_id and forwarded["f1"].span_id != TRACE.split("-")[2]
    assert forwarded["f2"].trace_id != trace_id  # a new trace, and still forwarded
    (reply, _), = env.replies_with({"n1"})
    assert tracing.parse(reply.headers[tracing.TRACEPARENT_HEADER]).trace_id == trace_id

    dead_letters = [dead("tk", "expired", "e1", rq), dead("tk", "delivery_limit", "d1", rq)]
    for delivery in dead_letters:
        delivery.properties.headers[tracing.TRACEPARENT_HEADER] = TRACE
    env.call("rpc_dead_letters",
             event_of(protocol.dl_queue(env.pool), [rmq_message(d) for d in dead_letters]))
    replies = env.replies_with({"e1", "d1"})
    assert {tracing.parse(props.headers[tracing.TRACEPARENT_HEADER]).trace_id for props, _ in replies} == {
        trace_id}
    poisoned = {props.correlation_id: props.headers
                for props, _ in env.drain(protocol.poison_queue(env.pool))}
    assert poisoned["d1"][tracing.TRACEPARENT_HEADER] == poisoned["n1"][tracing.TRACEPARENT_HEADER] == TRACE


# -- activity ---------------------------------------------------------------------------------------
def activity(key: str | None, event: Any = "request-received", latency: Any = None) -> RmqDelivery:
    headers: dict[str, Any] = {protocol.WORKER_ID_HEADER: "w1"}
    if latency is not None:
        headers[protocol.LATENCY_HEADER] = latency
    if event is not None:
        headers[protocol.EVENT_HEADER] = event
    if key is not None:
        headers[protocol.KEY_HEADER] = key
    return RmqDelivery(b"", pika.BasicProperties(headers=headers, timestamp=1_700_000_000))


def test_activity_handler_survives_garbage_and_tracks_the_good(env: Env) -> None:
    for key in ("b1", "b2"):
        env.state.touch([key])
        assert env.state.set_status(env.state.get(key), GroupStatus.UNBOUND)
    good = [activity(k) for k in ODD_KEYS] + [activity("b1"), activity("b2", "started")]
    odd_events = [activity("z", "exploded"), activity("z", None), activity("z", 7)]
    messages = [rmq_message(d) for d in (*good, *odd_events, activity(None))]
    garbage = garbage_messages()
    hostile = hostile_messages("h", env.reply_queue)
    outcome = env.call("rpc_activity",
                       event_of(protocol.activity_queue(env.pool), [*garbage, *hostile, *messages]))

    assert outcome["events"] == len(garbage) + len(hostile) + len(messages)
    assert outcome["unknown_events"] >= 3
    # b1, b2 were Unbound; the others were unknown (state lost, or workers started by hand).
    assert outcome["reactivated"] == len(ODD_KEYS) + 2
    groups = env.state.groups()
    assert "z" not in groups
    for key in [*ODD_KEYS, "b1", "b2"]:
        assert groups[key].status is GroupStatus.ACTIVE
    # The revived groups' queues are bound again: a request routed by key lands in the queue.
    env.channel.confirm_delivery()
    env.channel.basic_publish(protocol.req_exchange(env.pool), protocol.routing_key("b1"), b"to b1",
                              mandatory=True)
    assert [b for _, b in env.drain(protocol.request_queue(env.pool, "b1"))] == [b"to b1"]


def test_activity_keeps_latency_reports_and_counts_malformed_ones(env: Env) -> None:
    good = [activity("a", latency="3 1.5 4.25 5"), activity("b", latency="1 2 2 2")]
    bad = [activity("a", latency=value) for value in ("", "x 1 2 3", "3 1 2", "0 1 2 3", "3 -1 2 3",
                                                       "3 1 2 inf", "3 1 2 3 4", 7, b"\xff\xfe")]
    outcome = env.call("rpc_activity", event_of(protocol.activity_queue(env.pool),
                                                [rmq_message(d) for d in (*good, *bad)]))
    assert (outcome["latency_reports"], outcome["malformed_latency"]) == (2, len(bad))
    reports = {(r.key, r.count, r.p50_ms, r.p99_ms, r.max_ms) for r in env.state.latency()}
    assert reports == {("a", 3, 1.5, 4.25, 5.0), ("b", 1, 2.0, 2.0, 2.0)}
    assert set(env.state.groups()) == {"a", "b"}  # a bad latency does not cost the report its key


def test_empty_and_missing_batches(env: Env) -> None:
    for function in ("rpc_orphans", "rpc_dead_letters", "rpc_activity"):
        outcome = env.call(function, {"eventSource": "aws:rmq", "rmqMessagesByQueue": {}})
        assert all(v == 0 for v in outcome.values() if isinstance(v, int)), (function, outcome)
        outcome = env.call(function, {"eventSource": "aws:rmq", "rmqMessagesByQueue": {"q::/": []}})
        assert all(v == 0 for v in outcome.values() if isinstance(v, int)), (function, outcome)


def test_a_malformed_event_is_a_clear_error_and_a_malformed_entry_one_bad_message(env: Env) -> None:
    """An event whose ``rmqMessagesByQueue`` is not an object cannot come from an event source
    mapping (a hand-made one, ``switchyard invoke``): refused, saying what the shape must be (it was
    an AttributeError in Powertools' event class). An entry that is not a list of messages is one
    malformed message, counted with the keyless ones, and the entries beside it are handled."""
    for function in ("rpc_orphans", "rpc_dead_letters", "rpc_activity"):
        for bad in (5, [], "x"):
            with pytest.raises(MalformedEventError, match="not an aws:rmq event"):
                env.call(function, {"eventSource": "aws:rmq", "rmqMessagesByQueue": bad})
    good = request("fine", b"ok", reply_to=env.reply_queue, correlation_id="fine")
    event = event_of(protocol.orphan_queue(env.pool), [rmq_message(good)])
    event["rmqMessagesByQueue"] = {"bad::/": 5, **event["rmqMessagesByQueue"], "worse::/": {"a": 1}}
    outcome = env.call("rpc_orphans", event)
    assert (outcome["orphans"], outcome["forwarded"], outcome["without_key"]) == (3, 1, 2)
    assert [body for _, body in env.drain(protocol.request_queue(env.pool, "fine"))] == [b"ok"]


# -- hardening: inputs that once broke a handler for good ------------------------------------------
def test_an_orphan_with_another_users_user_id_is_forwarded_not_refused_forever(env: Env) -> None:
    """The broker checks ``user_id`` against the publishing connection (406 otherwise): republished
    as it was, the batch failed on every redelivery and the orphan queue filled with duplicates."""
    props = request("u", b"mine", reply_to=env.reply_queue, correlation_id="u1").properties
    props.user_id = "someone-else"
    event = event_of(protocol.orphan_queue(env.pool), [rmq_message(RmqDelivery(b"mine", props))])
    outcome = env.call("rpc_orphans", event)
    assert outcome["forwarded"] == 1
    (got, body), = env.drain(protocol.request_queue(env.pool, "u"))
    # The forward carries the orphan handler's own user, which the broker checks (workers believe
    # x-switchyard-user-id from it); the request's user_id is kept in that header.
    publisher = pika.URLParameters(env.settings.connections.amqp_url).credentials.username
    assert body == b"mine" and got.user_id == publisher
    assert got.headers[protocol.ORIGINAL_USER_ID_HEADER] == "someone-else"


def test_a_staged_orphan_is_forwarded_clean_with_its_key_and_remaining_expiration(env: Env) -> None:
    """What the staging hop added is undone: a later death must read as the request's own."""
    died = datetime.now(UTC).replace(microsecond=0)
    staged = {protocol.DEATH_HEADER: [{"count": 1, "reason": "expired",
                                       "queue": protocol.orphan_staging_queue(env.pool),
                                       "time": died, "exchange": protocol.req_exchange(env.pool),
                                       "routing-keys": ["plain key"], "original-expiration": "60000"}],
              "x-first-death-reason": "expired",
              "x-first-death-queue": protocol.orphan_staging_queue(env.pool),
              "x-first-death-exchange": protocol.req_exchange(env.pool), "app": "kept"}
    props = pika.BasicProperties(correlation_id="s1", reply_to=env.reply_queue, headers=staged)
    event = event_of(protocol.orphan_queue(env.pool), [rmq_message(RmqDelivery(b"s", props))])
    outcome = env.call("rpc_orphans", event)
    assert outcome["forwarded"] == 1 and outcome["without_key"] == 0
    (got, _), = env.drain(protocol.request_queue(env.pool, "plain key"))
    headers = {k: v for k, v in got.headers.items() if k != protocol.DELIVERY_COUNT_HEADER}  # this delivery's
    assert tracing.parse(headers.pop(tracing.TRACEPARENT_HEADER))  # it had none: a new trace starts here
    assert headers == {protocol.KEY_HEADER: "plain key", "app": "kept"}
    assert 55_000 <= int(got.expiration) <= 60_000


def test_activity_never_starts_a_stopped_group_but_keeps_others_alive(env: Env) -> None:
    """Late reports for a stopped group are counted and ignored; only a request revives it."""
    for key in ("stopped", "unbound"):
        env.state.touch([key])
    assert env.state.set_status(env.state.get("stopped"), GroupStatus.STOPPED)
    assert env.state.set_status(env.state.get("unbound"), GroupStatus.UNBOUND)
    reports = [rmq_message(activity(k)) for k in ("stopped", "unbound", "stopped")]
    outcome = env.call("rpc_activity", event_of(protocol.activity_queue(env.pool), reports))
    assert outcome["late_for_stopped"] == 1 and outcome["reactivated"] == 1
    assert env.state.get("stopped").status is GroupStatus.STOPPED
    assert env.state.get("unbound").status is GroupStatus.ACTIVE
    outcome = env.call("rpc_orphans",
                       event_of(protocol.orphan_queue(env.pool), [rmq_message(request("stopped"))]))
    assert outcome["new_groups"] == 1 and env.state.get("stopped").status is GroupStatus.ACTIVE


def test_reconciler_skips_queue_names_it_did_not_make(env: Env) -> None:
    """``{pool}-req-%FF`` (not UTF-8 once decoded) made every pass raise, so a lost state never came back."""
    foreign = [f"{env.pool}-req-%FF", f"{env.pool}-req-%zz", f"{env.pool}-req-a%2"]
    for queue in foreign:
        env.channel.queue_declare(queue, durable=True)
    try:
        env.state.touch(["real"])
        env.plane.reconcile()  # declares nothing for "real": make its queue as the orphan path would
        with env.plane._lease() as (topology, _):
            topology.ensure_request_queue("real")
        flush_pool_state(env.plane.redis, env.pool)  # state lost: the next pass rebuilds from the broker
        outcome = env.call("rpc_reconcile", {"source": "aws.events"})
        assert outcome["foreign_queues"] >= len(foreign) and outcome["rebuilt_groups"] == 1
        assert env.state.get("real").status is GroupStatus.ACTIVE
    finally:
        for queue in foreign:
            env.channel.queue_delete(queue)


def test_a_redis_that_stops_answering_fails_the_call_instead_of_hanging(monkeypatch, pool) -> None:
    """A server that accepts and never answers: every control-plane call must end within the timeout."""
    import socket
    import threading
    import time

    from switchyard.rpc.settings import RpcSettings

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.extend(listener.accept()[0] for _ in range(16)), daemon=True).start()
    name, _ = pool
    monkeypatch.setenv("SWITCHYARD_REDIS_URL", f"redis://127.0.0.1:{listener.getsockname()[1]}/0")
    monkeypatch.setenv("SWITCHYARD_REDIS_TIMEOUT_S", "0.3")
    result: list[BaseException | None] = []
    planes: list[ControlPlane] = []

    def call() -> None:
        try:
            # Built here: a cluster client reads the slot map when it is made, so on a cluster the
            # construction is the first control-plane call to meet the silent server.
            planes.append(ControlPlane(ControlSettings(name, Delays(30, 30)), RpcSettings.from_env(),
                                       NoopDriver()))
            planes[0].reconcile()
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(10)
    try:
        assert result, "the control plane hung on a silent Redis"
        # On a cluster the client's first step, reading the slot map, is what times out.
        cluster_timeout = (isinstance(result[0], redis.exceptions.RedisClusterException)
                           and "Timeout" in str(result[0]))
        assert isinstance(result[0], redis.exceptions.TimeoutError) or cluster_timeout, result[0]
        assert time.monotonic() - started < 5
    finally:
        for plane in planes:
            plane.close()
        listener.close()
        for conn in held:
            conn.close()
