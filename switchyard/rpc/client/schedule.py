"""Scheduled calls from code: produced to the delay scheduler, answered into a durable reply queue.

``CallScheduler.schedule`` produces one call (switchyard/rpc/scheduling.py: its headers) to the delay
scheduler's input topic with an idempotent producer (``enable.idempotence``, ``acks=all``), as the
Spark job does; the returned future resolves to the call's id once Kafka confirmed it. At its
deadline (at once if it has passed) the scheduler fires it and the relay publishes it into the pool.
Where the answer goes is the caller's: nowhere (the default, like ``send``), or a durable reply queue
``switchyard-reply-{name}`` (declared here; classic, durable), which outlives the process: ``collect``
reads the answers there by call id, today or after a restart.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta

import pika
import pika.exceptions
from confluent_kafka import KafkaError, Producer

from switchyard.core.msk_auth import kafka_security_config
from switchyard.delay.parsing import parse_deadline
from switchyard.delay.settings import DelaySettings, validate_topic
from switchyard.rpc import frames, protocol
from switchyard.rpc.amqp import connect
from switchyard.rpc.client.response import Response, status_of
from switchyard.rpc.errors import BrokerError
from switchyard.rpc.scheduling import ScheduledCall, request_properties, scheduled_headers, validate_call_id
from switchyard.rpc.settings import RpcSettings

When = datetime | str | float | int
SCAN_S = 1.0  # the least time collect gives one look over a reply queue (timeout 0 included)


def deadline_of(at: When, now: datetime | None = None) -> datetime:
    """A deadline from an aware datetime (naive is UTC), an ISO-8601 string, or seconds from now."""
    now = now or datetime.now(UTC)
    if isinstance(at, bool):
        raise TypeError("at must be a datetime, an ISO-8601 string or seconds from now")
    if isinstance(at, int | float):
        return now + timedelta(seconds=at)
    if isinstance(at, datetime):
        return at if at.tzinfo else at.replace(tzinfo=UTC)
    if isinstance(at, str):
        return parse_deadline(at)
    raise TypeError(f"at must be a datetime, an ISO-8601 string or seconds from now, not {type(at).__name__}")


def declare_reply_queue(settings: RpcSettings, name: str) -> str:
    """Declare the durable reply queue ``name`` stands for (idempotent); returns its full name."""
    queue = protocol.reply_queue(name)
    try:
        connection = connect(settings.connections.amqp_url, "switchyard-reply-queue")
        try:
            connection.channel().queue_declare(
                queue, durable=True,
                arguments={protocol.QUEUE_TYPE_ARGUMENT: protocol.QueueType.CLASSIC.value})
        finally:
            connection.close()
    except pika.exceptions.AMQPError as exc:
        raise BrokerError(f"declaring reply queue {queue!r}: {exc!r}") from exc
    return queue


class CallScheduler:
    """One pool's scheduled calls; a producer and the thread that serves its delivery reports."""

    def __init__(self, pool: str, settings: RpcSettings, topic: str | None = None) -> None:
        self.pool = protocol.validate_pool(pool)
        self.settings = settings
        self.topic = validate_topic(topic or DelaySettings.from_env().input_topic)
        self._producer = Producer({"bootstrap.servers": settings.connections.kafka_bootstrap,
                                   "enable.idempotence": True, "acks": "all", "linger.ms": 2,
                                   "client.id": "switchyard-scheduler", "log_level": 4,  # warnings up
                                   **kafka_security_config()})
        self._declared: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="switchyard-scheduler", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def schedule(self, key: str, body: bytes | str = b"", *, at: When = 0, reply: str | None = None,
                 call_id: str | None = None, expiration_ms: int | None = None) -> Future[str]:
        """Schedule a call of ``key`` at ``at``; the future resolves to its id once Kafka has it.

        ``reply``: a durable reply queue's name (answers kept there for ``collect``); None: no answer.
        ``expiration_ms``: the call is not made if it fires more than this after its deadline.
        """
        protocol.validate_key(key)
        data = protocol.body_bytes(body, "a request body must be bytes or str")
        deadline = deadline_of(at)
        call_id = validate_call_id(call_id) if call_id is not None else uuid.uuid4().hex
        if expiration_ms is not None and (isinstance(expiration_ms, bool)
                                          or not isinstance(expiration_ms, int) or expiration_ms <= 0):
            raise ValueError(f"expiration_ms must be a positive integer, got {expiration_ms!r}")
        reply_queue = None
        if reply is not None:
            reply_queue = protocol.reply_queue(reply)
            if reply not in self._declared:
                declare_reply_queue(self.settings, reply)
                self._declared.add(reply)
        expires = None if expiration_ms is None else int(deadline.timestamp() * 1000) + expiration_ms
        if expires is not None and expires not in frames.LONG_LONG:
            raise ValueError(f"expiration_ms {expiration_ms} puts the call's expiry past what AMQP carries "
                             "(epoch milliseconds in a 64-bit signed integer)")
        call = ScheduledCall(call_id, self.pool, key, data, reply_queue, expires)
        problem = frames.fault(request_properties(call, int(time.time() * 1000)), pika.spec.FRAME_MAX_SIZE)
        if problem is not None:  # the relay would park it: refused here, for its caller
            raise ValueError(f"a scheduled call AMQP cannot carry: {problem}")
        future: Future[str] = Future()

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                future.set_exception(BrokerError(f"Kafka refused scheduled call {call_id}: {err}"))
            else:
                future.set_result(call_id)

        while True:
            try:
                self._producer.produce(self.topic, key=key.encode(), value=data,
                                       headers=scheduled_headers(call, deadline),  # type: ignore[arg-type]
                                       on_delivery=delivered)
                return future
            except BufferError:  # the local queue is full: the serving thread drains it
                time.sleep(0.01)

    def close(self, timeout: float = 10.0) -> None:
        """Wait up to ``timeout`` for outstanding reports, then stop."""
        self._producer.flush(timeout)
        self._stop.set()
        self._thread.join(5)


def collect(settings: RpcSettings, reply: str, ids: Iterable[str] | None = None,
            timeout: float = 0.0, stop: threading.Event | None = None) -> dict[str, Response]:
    """Take the answers in the durable reply queue ``reply``: those of ``ids`` (waiting up to
    ``timeout`` seconds for them all), or every answer there now (``ids`` None). Answers taken are
    removed from the queue; others stay for their own collectors. Keyed by call id.

    With ``ids``, it returns by ``timeout`` (at least ``SCAN_S``: one look at a deep queue) even
    mid-queue: the queue is read from its head one answer per round trip (some thousands a second),
    so an answer behind more than that stays for the next collect. The answers it passes over are
    held (unacked, invisible to others) only while it reads; before each wait they go back, so
    another collector of the same queue finds its own meanwhile. ``stop`` set: it returns what it has
    taken so far at its next round trip (the asyncio client's cancelled collect puts those back)."""
    queue = protocol.reply_queue(reply)
    wanted = None if ids is None else set(ids)
    found: dict[str, Response] = {}
    try:
        connection = connect(settings.connections.amqp_url, "switchyard-collect")
    except pika.exceptions.AMQPError as exc:
        raise BrokerError(f"connecting to collect from {queue!r}: {exc!r}") from exc
    try:
        channel = connection.channel()
        end = time.monotonic() + max(timeout, SCAN_S)
        held = False  # answers for other ids taken and not acked
        while True:
            method, props, body = channel.basic_get(queue, auto_ack=False)
            if method is not None:
                cid = props.correlation_id
                if cid is not None and (wanted is None or cid in wanted):
                    headers = props.headers or {}
                    found[cid] = Response(status_of(headers), body, cid, headers)
                    channel.basic_ack(method.delivery_tag)
                else:
                    held = True
            if wanted is not None and (wanted <= found.keys() or time.monotonic() >= end):
                break
            if stop is not None and stop.is_set():
                break
            if method is None:
                if wanted is None:
                    break
                if held:  # back into the queue, for the other collectors while this one waits
                    channel.basic_nack(0, multiple=True, requeue=True)
                    held = False
                connection.sleep(0.05)
        connection.close()
    except pika.exceptions.AMQPError as exc:
        if connection.is_open:
            connection.close()
        raise BrokerError(f"collecting from {queue!r}: {exc!r}") from exc
    return found


def put_back(settings: RpcSettings, reply: str, answers: Iterable[Response]) -> None:
    """Publish answers taken by ``collect`` back into the reply queue ``reply`` (persistent, their call
    id and headers), for a collector whose caller went away before it could have them."""
    queue = protocol.reply_queue(reply)
    try:
        connection = connect(settings.connections.amqp_url, "switchyard-collect")
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            for answer in answers:
                channel.basic_publish("", queue, answer.body, pika.BasicProperties(
                    correlation_id=answer.correlation_id, headers=dict(answer.headers),
                    delivery_mode=pika.DeliveryMode.Persistent))
        finally:
            connection.close()
    except pika.exceptions.AMQPError as exc:
        raise BrokerError(f"putting answers back into {queue!r}: {exc!r}") from exc
