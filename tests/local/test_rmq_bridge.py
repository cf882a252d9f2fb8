"""The RabbitMQ event-source bridge: the event shape alone, the mapping against the real RabbitMQ."""

from __future__ import annotations

import base64
import copy
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pika
import pytest
import requests
from aws_lambda_powertools.utilities.data_classes.rabbit_mq_event import RabbitMQEvent

from switchyard.core.config import Connections, service_urls
from switchyard.local.rmq_bridge import (
    RabbitMQEventSource,
    RmqDelivery,
    build_rmq_event,
    format_timestamp,
)
from switchyard.rpc.control.rmq_event import (
    decode_header_value,
    decode_headers,
    parse_timestamp,
    to_amqp_message,
)
from tests.conftest import unique, wait_for
from tests.local import sample_rmq_events

AMQP_URL = Connections.from_env().amqp_url


# -- pure -------------------------------------------------------------------------------------
def test_timestamp_format_matches_the_aws_sample() -> None:
    assert format_timestamp(2021) == "Jan 1, 1970, 12:33:41 AM"  # AWS / Powertools sample event
    assert format_timestamp(1764590941) == "Dec 1, 2025, 12:09:01 PM"
    assert format_timestamp(datetime(2024, 2, 29, 0, 5, 9, tzinfo=UTC)) == "Feb 29, 2024, 12:05:09 AM"


def test_any_year_is_formatted_and_read_back_and_nothing_unrepresentable_stops_the_event() -> None:
    """A ``timestamp`` in milliseconds (a stranger's client) raised ``year 58888 is out of range``
    in the bridge's thread, which died; Java formats any year, and so does the bridge now."""
    ms = 1_796_126_941_000
    assert format_timestamp(ms) == "Dec 30, 58886, 6:16:40 AM"  # numpy agrees: 58886-12-30T06:16:40
    assert parse_timestamp(format_timestamp(ms)) == ms
    assert parse_timestamp(format_timestamp(-10**12)) == -10**12
    props = pika.BasicProperties(timestamp=ms, headers={"odd": object()}, correlation_id="c")
    message = build_rmq_event("q", "/", [RmqDelivery(b"x", props)])["rmqMessagesByQueue"]["q::/"][0]
    amqp = to_amqp_message("q", message)
    assert amqp.properties.correlation_id == "c" and amqp.undecodable is not None
    assert "cannot put a object header value" in amqp.undecodable


def test_headers_take_the_java_client_shape_and_decode_back() -> None:
    headers = {"s": "value1", "n": 10, "neg": -7, "f": 1.5, "t": True, "none": None, "raw": b"\xff\x00",
               "é": "ü", "nested": {"k": "v", "count": 2}, "list": ["a", 1, {"x": "y"}],
               "when": datetime.fromtimestamp(2021, UTC)}
    event = build_rmq_event("q", "/", [RmqDelivery(b"", pika.BasicProperties(headers=headers))])
    encoded = event["rmqMessagesByQueue"]["q::/"][0]["basicProperties"]["headers"]
    assert encoded["s"] == {"bytes": [118, 97, 108, 117, 101, 49]}  # as in AWS's sample event
    assert encoded["n"] == 10 and encoded["neg"] == -7 and encoded["t"] is True and encoded["none"] is None
    assert encoded["é"] == {"bytes": [-61, -68]}  # Java bytes are signed
    assert encoded["raw"] == {"bytes": [-1, 0]}
    assert encoded["nested"] == {"k": {"bytes": [118]}, "count": 2}
    assert encoded["list"] == [{"bytes": [97]}, 1, {"x": {"bytes": [121]}}]
    assert encoded["when"] == "Jan 1, 1970, 12:33:41 AM"
    json.dumps(event)  # JSON-serializable as is
    decoded = decode_headers(encoded)
    assert decoded == {**headers, "raw": b"\xff\x00", "when": "Jan 1, 1970, 12:33:41 AM"}
    assert decode_header_value({"bytes": [195, 188]}) == "ü"  # unsigned byte values work too


@pytest.mark.parametrize("name", sorted(sample_rmq_events.SAMPLES))
def test_sample_events_are_current_and_parse_with_powertools(name: str) -> None:
    built = sample_rmq_events.SAMPLES[name]()
    on_disk = (sample_rmq_events.EVENTS_DIR / name).read_text(encoding="utf-8")
    assert on_disk == sample_rmq_events.render(built), "run python -m tests.local.sample_rmq_events"
    event = RabbitMQEvent(json.loads(on_disk))
    assert event.event_source == "aws:rmq"
    [(queue_key, messages)] = event.rmq_messages_by_queue.items()
    assert queue_key.startswith("demo-") and queue_key.endswith("::/")
    headers = decode_headers(messages[0].basic_properties.headers)
    if name == "rmq_dead_letter.json":
        assert headers["x-first-death-reason"] == "expired"
        assert headers["x-death"][0]["reason"] == "expired" and headers["x-death"][0]["count"] == 1
        assert messages[0].basic_properties.reply_to and messages[0].basic_properties.correlation_id
    if name == "rmq_orphan.json":
        assert headers["x-switchyard-key"] == "infra=42"
        assert messages[0].json_data == {"train": "TGV 6611"}
    if name == "rmq_activity.json":
        assert headers["x-event"] == "request-received" and headers["x-worker-id"]
        assert headers["x-switchyard-key"] == "infra=42"


# -- against RabbitMQ -----------------------------------------------------------------------------
@pytest.fixture
def connection() -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def queue(connection: pika.BlockingConnection) -> Iterator[str]:
    name = unique("rmqbridge")
    connection.channel().queue_declare(name, durable=True)
    yield name
    connection.channel().queue_delete(name)


def publish(connection: pika.BlockingConnection, queue: str, *bodies: bytes,
            props: pika.BasicProperties | None = None) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", queue, body, props or pika.BasicProperties())
    channel.close()


def depth(connection: pika.BlockingConnection, queue: str) -> int:
    return connection.channel().queue_declare(queue, passive=True).method.message_count


class Recorder:
    """A handler that records each event (and when it came), failing its first ``fail`` invocations."""

    def __init__(self, fail: int = 0, gate: threading.Event | None = None, first_call_s: float = 0) -> None:
        self.events: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.fail = fail
        self.gate = gate
        self.first_call_s = first_call_s
        self.entered = threading.Event()
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any], context: Any) -> None:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            assert context.get_remaining_time_in_millis() > 0
            self.events.append(copy.deepcopy(event))
            self.times.append(time.monotonic())
            self.entered.set()
            if self.gate is not None:
                self.gate.wait(10)
            if len(self.events) == 1:
                time.sleep(self.first_call_s)  # pace: a slow first invocation
            if len(self.events) <= self.fail:
                raise RuntimeError("handler failure on purpose")
        finally:
            with self._lock:
                self.active -= 1

    def messages(self, i: int, queue: str) -> list[dict[str, Any]]:
        return self.events[i]["rmqMessagesByQueue"][f"{queue}::/"]

    def bodies(self, i: int, queue: str) -> list[bytes]:
        return [base64.b64decode(m["data"]) for m in self.messages(i, queue)]


@pytest.fixture
def running() -> Iterator[Any]:
    """``running(source)`` starts a source in a thread; every one is stopped and joined after the test."""
    started: list[tuple[threading.Event, threading.Thread]] = []

    def start(source: RabbitMQEventSource) -> threading.Event:
        stop = threading.Event()
        started.append((stop, source.run_in_thread(stop)))
        return stop

    yield start
    for stop, thread in started:
        stop.set()
        thread.join(15)
        assert not thread.is_alive()


def source(queue: str, handler: Recorder, **options: Any) -> RabbitMQEventSource:
    return RabbitMQEventSource(queue, handler, amqp_url=AMQP_URL, function_name="test-fn", **options)


def test_a_batch_closes_at_batch_size(connection, queue, running) -> None:
    publish(connection, queue, *[f"m{i}".encode() for i in range(7)])
    handler = Recorder()
    started = time.monotonic()
    running(source(queue, handler, batch_size=3, batching_window_s=30))
    wait_for(lambda: len(handler.events) >= 2, timeout=10, what="two full batches")
    assert time.monotonic() - started < 30  # closed by size, long before the window
    assert handler.bodies(0, queue) == [b"m0", b"m1", b"m2"]
    assert handler.bodies(1, queue) == [b"m3", b"m4", b"m5"]
    assert handler.max_active == 1


def test_a_partial_batch_closes_after_the_window(connection, queue, running) -> None:
    handler = Recorder()
    running(source(queue, handler, batch_size=100, batching_window_s=0.4))
    published = time.monotonic()
    publish(connection, queue, b"a", b"b")
    wait_for(lambda: handler.events, timeout=10, what="a partial batch")
    assert handler.times[0] - published >= 0.35  # the window, not the size, closed it
    assert handler.bodies(0, queue) == [b"a", b"b"]
    wait_for(lambda: depth(connection, queue) == 0, timeout=5, what="the batch acked")


def test_the_handler_gets_the_exact_bodies_properties_and_headers(connection, queue, running) -> None:
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", delivery_mode=2, priority=3,
        correlation_id="abcd.1.7", reply_to="amq.rabbitmq.reply-to.xyz", expiration="60000",
        message_id="msg-1", timestamp=2021, type="request", user_id="guest", app_id="tests",
        headers={"x-switchyard-key": "infra=42", "x-int": 42, "x-neg": -1, "x-flag": False,
                 "x-nested": {"a": "b"}},
    )
    body = json.dumps({"hello": "wörld"}).encode()
    publish(connection, queue, body, props=props)
    handler = Recorder()
    running(source(queue, handler, batch_size=10, batching_window_s=0.1))
    wait_for(lambda: handler.events, timeout=10, what="an invocation")
    event = handler.events[0]
    assert event["eventSource"] == "aws:rmq" and event["eventSourceArn"].startswith("arn:aws:mq:")
    [message] = handler.messages(0, queue)
    assert base64.b64decode(message["data"]) == body
    assert message["redelivered"] is False
    assert message["basicProperties"] == {
        "contentType": "application/json",
        "contentEncoding": "utf-8",
        "headers": {"x-switchyard-key": {"bytes": list(b"infra=42")}, "x-int": 42, "x-neg": -1,
                    "x-flag": False, "x-nested": {"a": {"bytes": [98]}}},
        "deliveryMode": 2,
        "priority": 3,
        "correlationId": "abcd.1.7",
        "replyTo": "amq.rabbitmq.reply-to.xyz",
        "expiration": "60000",
        "messageId": "msg-1",
        "timestamp": "Jan 1, 1970, 12:33:41 AM",
        "type": "request",
        "userId": "guest",
        "appId": "tests",
        "clusterId": None,
        "bodySize": len(body),
    }
    # Powertools reads the same event
    parsed = RabbitMQEvent(event)
    [pt_message] = parsed.rmq_messages_by_queue[f"{queue}::/"]
    assert pt_message.json_data == {"hello": "wörld"}
    assert pt_message.basic_properties.correlation_id == "abcd.1.7"
    assert pt_message.basic_properties.reply_to == "amq.rabbitmq.reply-to.xyz"
    assert pt_message.basic_properties.get_type == "request"
    assert decode_headers(pt_message.basic_properties.headers)["x-switchyard-key"] == "infra=42"


def test_a_failed_batch_is_redelivered_whole_and_nothing_is_lost(connection, queue, running) -> None:
    publish(connection, queue, b"1", b"2", b"3")
    handler = Recorder(fail=1)
    bridge = source(queue, handler, batch_size=10, batching_window_s=0.2, retry_backoff_s=0.1)
    running(bridge)
    wait_for(lambda: len(handler.events) >= 2, timeout=10, what="the redelivered batch")
    assert handler.bodies(0, queue) == [b"1", b"2", b"3"]
    assert [m["redelivered"] for m in handler.messages(0, queue)] == [False] * 3
    assert sorted(handler.bodies(1, queue)) == [b"1", b"2", b"3"]
    assert [m["redelivered"] for m in handler.messages(1, queue)] == [True] * 3
    wait_for(lambda: depth(connection, queue) == 0 and bridge.stats.acked == 3, timeout=5, what="acked")
    assert (bridge.stats.failures, bridge.stats.requeued) == (1, 3)


def test_an_invocation_over_its_timeout_counts_as_a_failure(connection, queue, running) -> None:
    handler = Recorder(first_call_s=0.3)
    bridge = source(queue, handler, batch_size=1, batching_window_s=0, timeout_ms=100, retry_backoff_s=0.05)
    running(bridge)
    publish(connection, queue, b"slow")
    wait_for(lambda: len(handler.events) >= 2, timeout=10, what="the batch delivered again")
    assert handler.messages(1, queue)[0]["redelivered"] is True
    assert bridge.stats.failures >= 1


def test_stop_finishes_the_batch_in_hand(connection, queue) -> None:
    gate = threading.Event()
    handler = Recorder(gate=gate)
    bridge = source(queue, handler, batch_size=10, batching_window_s=0.1)
    stop = threading.Event()
    thread = bridge.run_in_thread(stop)
    publish(connection, queue, b"x", b"y")
    wait_for(lambda: handler.entered.is_set(), timeout=10, what="the handler running")
    stop.set()
    assert thread.is_alive()  # waits for the invocation in hand
    gate.set()
    thread.join(10)
    assert not thread.is_alive()
    assert bridge.stats.acked == 2 and bridge.stats.invocations == 1
    assert depth(connection, queue) == 0
    assert connection.channel().queue_declare(queue, passive=True).method.consumer_count == 0


def management_api_url() -> str:
    """The configured management URL (the first of a cluster's list: any node lists every connection)."""
    return service_urls(Connections.from_env().management_url)[0]


def connection_names(name: str) -> list[str]:
    api = management_api_url()
    response = requests.get(f"{api}/api/connections", timeout=5)
    response.raise_for_status()
    return [c["name"] for c in response.json()
            if (c.get("client_properties") or {}).get("connection_name") == name]


def test_it_reconnects_after_the_connection_is_closed_by_the_broker(connection, queue, running) -> None:
    handler = Recorder()
    function_name = unique("fn")
    bridge = RabbitMQEventSource(queue, handler, amqp_url=AMQP_URL, function_name=function_name,
                                 batch_size=10, batching_window_s=0.05, retry_backoff_s=0.05)
    running(bridge)
    publish(connection, queue, b"before")
    wait_for(lambda: handler.events, timeout=10, what="the first invocation")
    # Close the bridge's connection from the broker side, as a broker restart or failover would.
    names = wait_for(lambda: connection_names(f"switchyard-rmq-event-source-{function_name}"), timeout=15,
                     what="the bridge's connection in the management API")
    api = management_api_url()
    for name in names:
        requests.delete(f"{api}/api/connections/{quote(name, safe='')}", timeout=5).raise_for_status()
    wait_for(lambda: bridge.stats.reconnects >= 1, timeout=10, what="the bridge noticing")
    publish(connection, queue, b"after")
    wait_for(lambda: len(handler.events) >= 2, timeout=15, what="an invocation after reconnecting")
    assert handler.bodies(1, queue) == [b"after"]


def test_it_resumes_after_its_queue_is_deleted_and_recreated(connection, queue, running) -> None:
    handler = Recorder()
    bridge = source(queue, handler, batch_size=10, batching_window_s=0.05, retry_backoff_s=0.05)
    running(bridge)
    publish(connection, queue, b"before")
    wait_for(lambda: handler.events, timeout=10, what="the first invocation")
    connection.channel().queue_delete(queue)  # the broker cancels the consumer
    wait_for(lambda: bridge.stats.reconnects >= 1, timeout=10, what="the bridge noticing")
    connection.channel().queue_declare(queue, durable=True)
    publish(connection, queue, b"after")
    wait_for(lambda: len(handler.events) >= 2, timeout=15, what="an invocation after reconnecting")
    assert handler.bodies(1, queue) == [b"after"]
