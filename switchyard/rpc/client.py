"""The slotted RPC client (seed 001) for keyed pools (seed 000).

One connection, one channel and one reply queue per client, driven by a background I/O thread.
Every public method is thread-safe. ``submit`` returns a ``concurrent.futures.Future`` (wrap it
with ``asyncio.wrap_future`` in async code); ``call`` blocks for the response. Futures complete
in the I/O thread: their done-callbacks must not block, but they may call ``submit``.

When all slots are taken, ``submit`` waits for one to free up, at most the call's timeout, then
raises ``ClientBusyError`` (called from a done-callback, it raises at once instead of waiting).
"""

from __future__ import annotations

import contextlib
import heapq
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import pika
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from switchyard.errors import (
    BrokerUnavailableError,
    CallTimeoutError,
    ClientBusyError,
    ClientClosedError,
    PoolNotFoundError,
    PublishRejectedError,
    RemoteError,
    UnroutableError,
)
from switchyard.observability import logger
from switchyard.rpc import protocol as p
from switchyard.rpc.amqp import close_reason, connect, enable_async_confirms, publish_buffered
from switchyard.rpc.settings import RpcSettings
from switchyard.rpc.slots import SlotTable
from switchyard.rpc.topology import NOT_FOUND

_MAX_LOOP_WAIT = 0.2
_RECONNECT_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True, slots=True)
class Response:
    """A response: ``status`` is ``ok``, ``error`` (the worker failed) or a dead-letter reason."""

    status: str
    body: bytes
    correlation_id: str
    headers: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == p.Status.OK

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def raise_for_status(self) -> Response:
        if not self.ok:
            raise RemoteError(self.status, self.body)
        return self


@dataclass(slots=True)
class _Call:
    key: str
    body: bytes
    timeout: float
    expiration_ms: int | None
    headers: dict[str, Any]
    future: Future
    slot: int = 0
    seq: int = 0


@dataclass
class ClientStats:
    """Counters a caller or a benchmark can read; updated by the I/O thread only."""

    published: int = 0
    responses: int = 0
    stale_responses: int = 0
    malformed_responses: int = 0
    timeouts: int = 0
    returned: int = 0
    nacked: int = 0


def _header_str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RpcClient:
    """Calls workers of one pool by key. See the module docstring for threading rules."""

    def __init__(
        self,
        pool: str,
        settings: RpcSettings | None = None,
        *,
        concurrency: int | None = None,
        timeout: float | None = None,
        confirm: bool = False,
        name: str = "switchyard-client",
    ) -> None:
        self.pool = p.validate_pool(pool)
        self.settings = settings or RpcSettings.from_env()
        self.default_timeout = timeout if timeout is not None else self.settings.call_timeout
        self.confirm = confirm
        self.stats = ClientStats()
        self._name = name
        self._exchange = p.req_exchange(pool)
        self._slots: SlotTable[_Call] = SlotTable(concurrency or self.settings.client_concurrency)
        self._tag = os.urandom(4).hex()
        self._outbox: deque[_Call] = deque()
        self._wake_pending = False
        self._wake_lock = threading.Lock()
        self._deadlines: list[tuple[float, int, int]] = []
        self._unconfirmed: dict[int, _Call] = {}
        self._publish_seq = 0
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._reply_queue = ""
        self._closing = False
        self._ready = threading.Event()
        self._setup_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-io", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._setup_error is not None:
            self._thread.join()
            raise self._setup_error

    # -- public API -------------------------------------------------------------------------
    def submit(
        self,
        key: str,
        body: bytes | str = b"",
        *,
        timeout: float | None = None,
        expiration_ms: int | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> Future[Response]:
        """Send a request; the future resolves to a ``Response`` or fails with an ``RpcError``.

        ``expiration_ms`` defaults to the timeout: a request nobody waits for anymore expires in
        its queue instead of being worked on.
        """
        timeout = self.default_timeout if timeout is None else timeout
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if isinstance(body, str):
            body = body.encode("utf-8")
        p.routing_key(key)  # validates the key before anything is queued
        msg_headers = {**headers, p.KEY_HEADER: key} if headers else {p.KEY_HEADER: key}
        if expiration_ms is None:
            expiration_ms = max(1, int(timeout * 1000))
        future: Future[Response] = Future()
        call = _Call(key, body, timeout, expiration_ms, msg_headers, future)
        if self._closing:
            raise ClientClosedError("the client is closed")
        on_io_thread = threading.current_thread() is self._thread
        taken = self._slots.acquire(call, 0 if on_io_thread else timeout)
        if taken is None:
            raise ClientBusyError(
                f"all {self._slots.size} slots stayed busy for {timeout:.3g}s; "
                "raise the client's concurrency or add workers"
            )
        call.slot, call.seq = taken
        self._outbox.append(call)
        if not on_io_thread:
            self._wake()
        return future

    def call(self, key: str, body: bytes | str = b"", *, timeout: float | None = None,
             expiration_ms: int | None = None, headers: Mapping[str, Any] | None = None) -> Response:
        """Send a request and wait for its response (raises ``CallTimeoutError`` on timeout)."""
        timeout = self.default_timeout if timeout is None else timeout
        future = self.submit(key, body, timeout=timeout, expiration_ms=expiration_ms, headers=headers)
        # The I/O thread enforces the timeout; the margin only guards against a dead I/O thread.
        return future.result(timeout + 5.0)

    @property
    def in_flight(self) -> int:
        return self._slots.in_use()

    def close(self) -> None:
        """Fail calls still in flight with ``ClientClosedError`` and close the connection."""
        if self._closing:
            return
        self._closing = True
        self._wake()
        self._thread.join(10)

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- I/O thread -------------------------------------------------------------------------
    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_pending or self._connection is None:
                return
            self._wake_pending = True
        # A closed connection is noticed by the loop, which fails the calls.
        with contextlib.suppress(pika.exceptions.ConnectionWrongStateError):
            self._connection.add_callback_threadsafe(self._on_wake)

    def _on_wake(self) -> None:
        with self._wake_lock:
            self._wake_pending = False

    def _run(self) -> None:
        attempt = 0
        while not self._closing:
            try:
                self._open()
            except Exception as exc:
                if not self._ready.is_set():
                    self._setup_error = exc
                    self._ready.set()
                    return
                self._fail_all(BrokerUnavailableError(f"reconnecting to RabbitMQ: {exc}"))
                time.sleep(_RECONNECT_DELAYS[min(attempt, len(_RECONNECT_DELAYS) - 1)])
                attempt += 1
                continue
            attempt = 0
            self._ready.set()
            try:
                self._loop()
            except pika.exceptions.ChannelClosedByBroker as exc:
                error: Exception = (
                    PoolNotFoundError(f"pool {self.pool!r} is not initialized: {exc.reply_text}")
                    if exc.reply_code == NOT_FOUND
                    else BrokerUnavailableError(f"channel closed by the broker: {exc.reply_text}")
                )
                logger.warning("client channel closed; reopening", extra={"pool": self.pool,
                                                                          "reason": exc.reply_text})
                self._fail_all(error)
            except pika.exceptions.AMQPError as exc:
                logger.warning("client connection lost; reconnecting", extra={"pool": self.pool,
                                                                             "error": repr(exc)})
                self._fail_all(BrokerUnavailableError(f"connection to RabbitMQ lost: {exc!r}"))
        self._fail_all(ClientClosedError("the client was closed while the call was in flight"))
        self._shutdown_connection()

    def _open(self) -> None:
        if self._connection is None or not self._connection.is_open:
            self._connection = connect(self.settings.connections.amqp_url, self._name)
        channel = self._connection.channel()
        try:
            channel.exchange_declare(self._exchange, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == NOT_FOUND:
                raise PoolNotFoundError(
                    f"pool {self.pool!r} is not initialized (no exchange {self._exchange!r}); "
                    f"run: switchyard pool init --pool {self.pool}"
                ) from exc
            raise
        result = channel.queue_declare("", exclusive=True, auto_delete=True)
        self._reply_queue = result.method.queue
        channel.basic_consume(self._reply_queue, self._on_response, auto_ack=True)
        channel.add_on_return_callback(self._on_return)
        self._publish_seq = 0
        self._unconfirmed.clear()
        if self.confirm:
            enable_async_confirms(channel, self._on_confirm)
        self._channel = channel

    def _loop(self) -> None:
        connection = self._connection
        while not self._closing:
            if self._outbox:
                self._flush_outbox()
            wait = _MAX_LOOP_WAIT
            if self._deadlines:
                wait = min(wait, max(0.0, self._deadlines[0][0] - time.monotonic()))
            connection.process_data_events(time_limit=wait)
            if self._deadlines and self._deadlines[0][0] <= time.monotonic():
                self._expire()
            if self._channel is None or not self._channel.is_open:
                reason = close_reason(self._channel) if self._channel is not None else None
                if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
                    raise reason
                raise pika.exceptions.ChannelClosedByBroker(0, f"channel closed: {reason!r}")

    def _flush_outbox(self) -> None:
        channel = self._channel
        outbox = self._outbox
        now = time.monotonic()
        while outbox:
            call = outbox.popleft()
            if call.future.done():  # already failed (e.g. client closing)
                continue
            props = pika.BasicProperties(
                reply_to=self._reply_queue,
                correlation_id=f"{self._tag}.{call.slot}.{call.seq}",
                expiration=str(call.expiration_ms) if call.expiration_ms else None,
                headers=call.headers,
                delivery_mode=pika.DeliveryMode.Persistent,
            )
            if self.confirm:  # record before publishing: basic_publish may process the confirm
                self._publish_seq += 1
                self._unconfirmed[self._publish_seq] = call
            publish_buffered(channel, self._exchange, p.routing_key(call.key), call.body, props,
                             mandatory=True)
            self.stats.published += 1
            heapq.heappush(self._deadlines, (now + call.timeout, call.slot, call.seq))
        if len(self._deadlines) > 4 * self._slots.size + 1024:
            # Answered calls leave their deadline behind; drop those so the heap stays small.
            self._deadlines = [d for d in self._deadlines if self._slots.holds(d[1], d[2])]
            heapq.heapify(self._deadlines)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, slot, seq = heapq.heappop(self._deadlines)
            call = self._slots.complete(slot, seq)
            if call is not None:
                self.stats.timeouts += 1
                call.future.set_exception(CallTimeoutError(
                    f"no response for key {call.key!r} within {call.timeout:.3g}s"))

    def _parse_correlation_id(self, correlation_id: str | None) -> tuple[int, int] | None:
        if not correlation_id:
            return None
        parts = correlation_id.split(".")
        if len(parts) != 3 or parts[0] != self._tag:
            return None
        try:
            return int(parts[1]), int(parts[2])
        except ValueError:
            return None

    def _on_response(self, _channel: BlockingChannel, _method: pika.spec.Basic.Deliver,
                     props: pika.BasicProperties, body: bytes) -> None:
        parsed = self._parse_correlation_id(props.correlation_id)
        if parsed is None:
            self.stats.malformed_responses += 1
            logger.warning("response with a foreign or malformed correlation id dropped",
                           extra={"correlation_id": props.correlation_id})
            return
        call = self._slots.complete(*parsed)
        if call is None:
            # A late response to a call that timed out: its slot may already serve another call.
            self.stats.stale_responses += 1
            return
        self.stats.responses += 1
        headers = props.headers or {}
        status = _header_str(headers.get(p.STATUS_HEADER, p.Status.OK))
        call.future.set_result(Response(status, body, props.correlation_id, headers))

    def _on_return(self, _channel: BlockingChannel, method: pika.spec.Basic.Return,
                   props: pika.BasicProperties, _body: bytes) -> None:
        parsed = self._parse_correlation_id(props.correlation_id)
        call = self._slots.complete(*parsed) if parsed else None
        if call is not None:
            self.stats.returned += 1
            call.future.set_exception(UnroutableError(
                f"request for key {call.key!r} was returned by the broker: "
                f"{method.reply_code} {method.reply_text}"))

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        method = frame.method
        tags = (
            [tag for tag in self._unconfirmed if tag <= method.delivery_tag]
            if method.multiple else [method.delivery_tag]
        )
        nack = isinstance(method, pika.spec.Basic.Nack)
        for tag in tags:
            call = self._unconfirmed.pop(tag, None)
            if nack and call is not None and self._slots.complete(call.slot, call.seq) is not None:
                self.stats.nacked += 1
                call.future.set_exception(PublishRejectedError(
                    f"the broker refused the request for key {call.key!r}"))

    def _fail_all(self, error: Exception) -> None:
        self._outbox.clear()
        self._deadlines.clear()
        self._unconfirmed.clear()
        for call in self._slots.drain():
            if not call.future.done():
                call.future.set_exception(error)
        self._channel = None

    def _shutdown_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()
