"""An Amazon MQ (RabbitMQ) event source mapping, locally: consume a queue, hand batches to a Lambda handler.

As the AWS mapping does: a batch closes at ``batch_size`` messages or ``batching_window_s`` after its
first message; one invocation at a time (RabbitMQ mappings have a concurrency of one); the handler
gets the exact ``aws:rmq`` event; the whole batch is acked only after the handler returns, and if it
raises (or outruns its timeout) the whole batch is nacked with requeue, so it comes back with
``redelivered: true``. There is no partial batch response.

The event, as Lambda builds it (a Java service serializing the RabbitMQ Java client's objects):

* ``rmqMessagesByQueue`` is keyed ``<queue>::<vhost>``; each message has ``basicProperties``,
  ``redelivered`` and ``data`` (base64 body) only. The exchange and routing key are NOT in the
  event: a handler that needs the key must read it from a header (``x-switchyard-key``).
* every property is present, ``null`` when unset; ``bodySize`` is the body's length.
* ``timestamp`` (and timestamp header values) are formatted like Java's default en_US date
  format in UTC: ``"Jan 1, 1970, 12:33:41 AM"`` (AWS's and Powertools' sample event).
* header strings are the Java client's ``LongString``: ``{"bytes": [...]}``, with Java's signed
  bytes (non-ASCII UTF-8 bytes appear negative); numbers and booleans are plain; nested tables
  are objects and arrays are lists, converted the same way. Powertools does not decode headers:
  use ``switchyard.rpc.control.rmq_event.decode_headers``.
* not Lambda's, since the Java client reads what pika cannot: a message whose headers Switchyard's
  decoder could not read (``switchyard.rpc.amqp_decode``), or whose properties cannot be put into
  the event, carries ``x-switchyard-undecodable`` (the reason) in its headers, and its handler sends
  it to ``{pool}-poison``: one message never stops the mapping.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pika
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from switchyard.core.errors import BrokerError, ConfigError
from switchyard.core.observability import logger
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.rpc import protocol
from switchyard.rpc.amqp import connect, url_parameters
from switchyard.rpc.control.rmq_event import CALENDAR_CYCLE_S

Handler = Callable[[dict[str, Any], Any], Any]

DEFAULT_BROKER_ARN = "arn:aws:mq:local:000000000000:broker:local:b-00000000-0000-0000-0000-000000000000"
MAX_BATCH_SIZE = 10_000  # AWS's limit for Amazon MQ mappings
MAX_BATCHING_WINDOW_S = 300
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


# -- the event ----------------------------------------------------------------------------------
def format_timestamp(value: int | float | datetime) -> str:
    """An AMQP timestamp (seconds since the epoch) as Lambda prints it: ``Jan 1, 1970, 12:33:41 AM`` (UTC).
    Any year, as Java's dates: one in milliseconds (year 58,000 or so) too (``CALENDAR_CYCLE_S``)."""
    cycles: float = 0
    if isinstance(value, datetime):
        moment = value.astimezone(UTC) if value.tzinfo is not None else value
    else:
        cycles, seconds = divmod(value, CALENDAR_CYCLE_S)
        moment = datetime.fromtimestamp(seconds, UTC)
    hour = moment.hour % 12 or 12
    meridiem = "AM" if moment.hour < 12 else "PM"
    return (f"{_MONTHS[moment.month - 1]} {moment.day}, {moment.year + 400 * int(cycles)}, "
            f"{hour}:{moment.minute:02d}:{moment.second:02d} {meridiem}")


def _java_bytes(raw: bytes) -> list[int]:
    return [b - 256 if b > 127 else b for b in raw]


def encode_header_value(value: Any) -> Any:
    """A header value as pika decodes it -> its JSON form in the ``aws:rmq`` event."""
    if isinstance(value, str):
        return {"bytes": _java_bytes(value.encode("utf-8"))}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes": _java_bytes(bytes(value))}
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return value
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime):
        return format_timestamp(value)
    if isinstance(value, Mapping):
        return {str(k): encode_header_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode_header_value(v) for v in value]
    raise TypeError(f"cannot put a {type(value).__name__} header value in an aws:rmq event")


@dataclass(frozen=True, slots=True)
class RmqDelivery:
    """One consumed message: what the event needs, plus the tag to settle it and when it arrived."""

    body: bytes
    properties: pika.BasicProperties = field(default_factory=pika.BasicProperties)
    redelivered: bool = False
    delivery_tag: int = 0
    received_at: float = 0.0


def basic_properties(props: pika.BasicProperties, body_size: int) -> dict[str, Any]:
    """``basicProperties`` with AWS's field names; every field present, ``null`` when unset."""
    return {
        "contentType": props.content_type,
        "contentEncoding": props.content_encoding,
        "headers": None if props.headers is None else encode_header_value(props.headers),
        "deliveryMode": props.delivery_mode,
        "priority": props.priority,
        "correlationId": props.correlation_id,
        "replyTo": props.reply_to,
        "expiration": props.expiration,
        "messageId": props.message_id,
        "timestamp": None if props.timestamp is None else format_timestamp(props.timestamp),
        "type": props.type,
        "userId": props.user_id,
        "appId": props.app_id,
        "clusterId": props.cluster_id,
        "bodySize": body_size,
    }


def rmq_message(delivery: RmqDelivery) -> dict[str, Any]:
    """One delivery as an ``aws:rmq`` message."""
    try:
        props = basic_properties(delivery.properties, len(delivery.body))
    except Exception as exc:  # one message never stops the mapping: its handler poisons it
        reason = f"properties not representable in an aws:rmq event: {type(exc).__name__}: {exc}"
        props = basic_properties(pika.BasicProperties(**{**vars(delivery.properties), "timestamp": None,
                                                          "headers": {protocol.UNDECODABLE_HEADER: reason}}),
                                 len(delivery.body))
    return {
        "basicProperties": props,
        "redelivered": delivery.redelivered,
        "data": base64.b64encode(delivery.body).decode("ascii"),
    }


def build_rmq_event(queue: str, vhost: str, deliveries: Iterable[RmqDelivery], *,
                    broker_arn: str = DEFAULT_BROKER_ARN) -> dict[str, Any]:
    """The event Lambda receives from an Amazon MQ for RabbitMQ mapping on ``queue`` in ``vhost``."""
    return {
        "eventSource": "aws:rmq",
        "eventSourceArn": broker_arn,
        "rmqMessagesByQueue": {f"{queue}::{vhost}": [rmq_message(d) for d in deliveries]},
    }


# -- the mapping --------------------------------------------------------------------------------
@dataclass
class EventSourceStats:
    invocations: int = 0
    failures: int = 0
    acked: int = 0
    requeued: int = 0
    reconnects: int = 0


class _ConsumerCancelledError(BrokerError):
    """The broker cancelled the consumer (the queue was deleted): reconnect after a back-off."""


class RabbitMQEventSource:
    """Runs ``handler(event, context)`` on batches of ``queue`` until stopped (see the module docstring)."""

    def __init__(
        self,
        queue: str,
        handler: Handler,
        *,
        amqp_url: str,
        function_name: str,
        batch_size: int = 100,
        batching_window_s: float = 0.5,
        timeout_ms: int = 60_000,
        retry_backoff_s: float = 0.5,
        max_reconnect_backoff_s: float = 10.0,
        broker_arn: str = DEFAULT_BROKER_ARN,
    ) -> None:
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ConfigError(f"batch size must be 1 to {MAX_BATCH_SIZE}, got {batch_size}")
        if not 0 <= batching_window_s <= MAX_BATCHING_WINDOW_S:
            raise ConfigError(
                f"batching window must be 0 to {MAX_BATCHING_WINDOW_S} s, got {batching_window_s}")
        self.queue = queue
        self.handler = handler
        self.amqp_url = amqp_url
        self.function_name = function_name
        self.batch_size = batch_size
        self.batching_window_s = batching_window_s
        self.timeout_ms = timeout_ms
        self.retry_backoff_s = retry_backoff_s
        self.max_reconnect_backoff_s = max_reconnect_backoff_s
        self.broker_arn = broker_arn
        self.vhost = url_parameters(amqp_url).virtual_host
        self.stats = EventSourceStats()

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set; the batch in hand is settled first. Reconnects on loss."""
        backoff = self.retry_backoff_s
        while not stop.is_set():
            try:
                self._consume(stop)
                backoff = self.retry_backoff_s
            except (pika.exceptions.AMQPError, BrokerError) as exc:
                if stop.is_set():
                    break
                self.stats.reconnects += 1
                logger.warning("rabbitmq event source lost its connection; reconnecting",
                               extra={"function_name": self.function_name, "queue": self.queue,
                                      "error": f"{type(exc).__name__}: {exc}", "retry_in_s": backoff})
                stop.wait(backoff)
                backoff = min(backoff * 2, self.max_reconnect_backoff_s)

    def run_in_thread(self, stop: threading.Event) -> threading.Thread:
        """``run(stop)`` in a daemon thread; join it after setting ``stop``."""
        thread = threading.Thread(target=self.run, args=(stop,), daemon=True,
                                  name=f"rmq-event-source-{self.function_name}")
        thread.start()
        return thread

    # -- one connection's life -------------------------------------------------------------
    def _consume(self, stop: threading.Event) -> None:
        connection = connect(self.amqp_url, f"switchyard-rmq-event-source-{self.function_name}")
        buffer: deque[RmqDelivery] = deque()
        cancelled: list[bool] = []

        def on_message(_ch: BlockingChannel, method: pika.spec.Basic.Deliver,
                       props: pika.BasicProperties, body: bytes) -> None:
            buffer.append(RmqDelivery(body, props, bool(method.redelivered), method.delivery_tag,
                                      time.monotonic()))

        try:
            channel = connection.channel()
            # prefetch = batch size: unsettled messages (batch in hand + next ones) never exceed it.
            channel.basic_qos(prefetch_count=self.batch_size)
            channel.add_on_cancel_callback(lambda _frame: cancelled.append(True))
            channel.basic_consume(self.queue, on_message)
            logger.info("rabbitmq event source consuming", extra={"function_name": self.function_name,
                                                                  "queue": self.queue})
            while not stop.is_set():
                batch = self._collect(connection, buffer, stop, cancelled)
                if batch:
                    self._invoke_and_settle(connection, channel, batch, stop)
            # Messages received but not handed to the handler go back when the channel closes.
        finally:
            if connection.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    connection.close()

    def _collect(self, connection: pika.BlockingConnection, buffer: deque[RmqDelivery],
                 stop: threading.Event, cancelled: list[bool]) -> list[RmqDelivery]:
        """Wait until ``batch_size`` messages are in, or the window after the first one has passed."""
        while not stop.is_set():
            if cancelled:
                raise _ConsumerCancelledError(f"the broker cancelled the consumer of {self.queue!r}")
            if len(buffer) >= self.batch_size:
                break
            now = time.monotonic()
            if buffer and now >= buffer[0].received_at + self.batching_window_s:
                break
            wait = 0.1 if not buffer else buffer[0].received_at + self.batching_window_s - now
            connection.process_data_events(time_limit=max(0.0, min(0.1, wait)))
        if stop.is_set():
            return []
        return [buffer.popleft() for _ in range(min(self.batch_size, len(buffer)))]

    def _invoke_and_settle(self, connection: pika.BlockingConnection, channel: BlockingChannel,
                           batch: list[RmqDelivery], stop: threading.Event) -> None:
        """Run the handler in a helper thread while this one keeps the connection alive, then settle."""
        event = build_rmq_event(self.queue, self.vhost, batch, broker_arn=self.broker_arn)
        context = FakeLambdaContext(self.function_name, self.timeout_ms, stop)
        outcome: list[BaseException | None] = []

        def invoke() -> None:
            try:
                self.handler(event, context)
                outcome.append(None)
            except BaseException as exc:  # reported to the consuming thread, as Lambda reports it
                outcome.append(exc)
            with contextlib.suppress(Exception):  # wake the consuming thread (connection may be gone)
                connection.add_callback_threadsafe(lambda: None)

        self.stats.invocations += 1
        started = time.monotonic()
        invocation = threading.Thread(target=invoke, daemon=True, name=f"invoke-{self.function_name}")
        invocation.start()
        try:
            while not outcome:
                connection.process_data_events(time_limit=1.0)
        except pika.exceptions.AMQPError:
            invocation.join()  # concurrency one: never start another invocation while this one runs
            logger.warning("connection lost during an invocation; the broker redelivers the batch",
                           extra={"function_name": self.function_name, "messages": len(batch)})
            raise
        invocation.join()
        elapsed_ms = (time.monotonic() - started) * 1000
        error = outcome[0]
        if error is None and elapsed_ms > self.timeout_ms:
            error = TimeoutError(
                f"the invocation ran {elapsed_ms:.0f} ms, over its {self.timeout_ms} ms timeout")
        last_tag = batch[-1].delivery_tag  # batches are the oldest unsettled messages, in order
        if error is None:
            channel.basic_ack(last_tag, multiple=True)
            self.stats.acked += len(batch)
            return
        self.stats.failures += 1
        logger.error("handler failed; the whole batch will be delivered again",
                     exc_info=error, extra={"function_name": self.function_name, "queue": self.queue,
                                            "messages": len(batch)})
        channel.basic_nack(last_tag, multiple=True, requeue=True)
        self.stats.requeued += len(batch)
        deadline = time.monotonic() + self.retry_backoff_s
        while not stop.is_set() and time.monotonic() < deadline:
            connection.process_data_events(time_limit=max(0.0, min(0.1, deadline - time.monotonic())))
