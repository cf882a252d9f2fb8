"""The slotted RPC client (seed 001) for keyed pools (seed 000).

One connection, one channel and one reply queue per client, driven by a background I/O thread.
Every public method is thread-safe. ``submit`` returns a ``concurrent.futures.Future`` (wrap it
with ``asyncio.wrap_future`` in async code); ``call`` blocks for the response; ``send`` publishes a
request that expects no response (seed 000: no reply-to) and its future resolves once the broker
has it. Futures complete in the I/O thread: their done-callbacks must not block, but they may call
``submit``, ``send`` and ``close``.

When all slots are taken, ``submit`` waits for one to free up, at most the call's timeout, then
raises ``ClientBusyError`` (called from a done-callback, it raises at once instead of waiting).

A bad call fails alone: ``submit`` validates and encodes the request in the caller's thread and
raises a clear error there (``InvalidNameError`` for a key, ``TypeError`` / ``ValueError`` for a
body, headers, timeout or expiration), before it takes a slot. Nothing but a broker failure ends
the I/O loop; anything else fails the calls in flight and the client goes on.

The I/O thread runs a ``_ClientCore`` and never holds the ``RpcClient`` itself, so a client that is
dropped without ``close()`` is garbage collected, and a finalizer then closes its core: the thread
ends, the connection closes and the broker deletes the reply queue. Calls in flight keep their
client alive through their futures' callbacks only.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import os
import threading
import time
import weakref
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

from switchyard.core.errors import (
    BrokerUnavailableError,
    CallTimeoutError,
    ClientBusyError,
    ClientClosedError,
    PoolNotFoundError,
    PublishRejectedError,
    RemoteError,
    RpcError,
    UnroutableError,
)
from switchyard.core.observability import logger
from switchyard.rpc import protocol as p
from switchyard.rpc.amqp import close_reason, connect, enable_async_confirms, frame_max, publish_buffered
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
    routing_key: str
    body: bytes
    timeout: float
    props: pika.BasicProperties
    future: Future
    slot: int = 0
    seq: int = 0
    reply: bool = True  # False: sent without reply-to; done when the broker has it


@dataclass
class ClientStats:
    """Counters a caller or a benchmark can read; updated by the I/O thread only."""

    published: int = 0
    sent: int = 0  # requests without reply-to the broker has (``send``)
    responses: int = 0
    stale_responses: int = 0
    malformed_responses: int = 0
    timeouts: int = 0
    returned: int = 0
    nacked: int = 0


def _header_str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RpcClient:
    """Calls workers of one pool by key. See the module docstring for threading and reclaim rules."""

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
        settings = settings or RpcSettings.from_env()
        self._core = _ClientCore(pool, settings, concurrency, timeout, confirm, name)
        # Runs once: at close(), when the client is garbage collected, or at interpreter exit.
        self._finalizer = weakref.finalize(self, self._core.close)

    @property
    def pool(self) -> str:
        return self._core.pool

    @property
    def settings(self) -> RpcSettings:
        return self._core.settings

    @property
    def default_timeout(self) -> float:
        return self._core.default_timeout

    @property
    def stats(self) -> ClientStats:
        return self._core.stats

    @property
    def in_flight(self) -> int:
        return self._core.slots.in_use()

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
        its queue instead of being worked on (0: no expiration). A malformed request raises here,
        for this caller only.
        """
        return self._core.submit(key, body, timeout, expiration_ms, headers)

    def send(
        self,
        key: str,
        body: bytes | str = b"",
        *,
        timeout: float | None = None,
        expiration_ms: int = 0,
        headers: Mapping[str, Any] | None = None,
    ) -> Future[None]:
        """Send a request that expects no response: published without reply-to (seed 000).

        The future resolves to None once the broker has the request: when it confirms it on a
        ``confirm=True`` client, else once it is written. It fails like ``submit``'s on a nack, a
        return or a lost connection, and with ``CallTimeoutError`` if no confirm came within
        ``timeout``. ``expiration_ms`` defaults to 0 (the request waits for a worker however long).
        """
        return self._core.submit(key, body, timeout, expiration_ms, headers, reply=False)

    def call(self, key: str, body: bytes | str = b"", *, timeout: float | None = None,
             expiration_ms: int | None = None, headers: Mapping[str, Any] | None = None) -> Response:
        """Send a request and wait for its response (raises ``CallTimeoutError`` on timeout)."""
        timeout = self._core.default_timeout if timeout is None else timeout
        future = self._core.submit(key, body, timeout, expiration_ms, headers)
        # The I/O thread enforces the timeout; the margin only guards against a dead I/O thread.
        return future.result(timeout + 5.0)

    def close(self) -> None:
        """Fail calls still in flight with ``ClientClosedError`` and close the connection.

        Safe from any thread, a done-callback included (it then does not wait for the I/O thread).
        """
        self._finalizer()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


_CID_ROOM = 40  # bytes a correlation id may take: tag, slot and sequence number
_FRAME_OVERHEAD = 8 + 14  # frame header and end, content header's class, weight and body size


class _ClientCore:
    """The state the I/O thread works on. It holds no reference to its ``RpcClient``."""

    def __init__(self, pool: str, settings: RpcSettings, concurrency: int | None, timeout: float | None,
                 confirm: bool, name: str) -> None:
        self.pool = p.validate_pool(pool)
        self.settings = settings
        self.default_timeout = timeout if timeout is not None else self.settings.call_timeout
        self.confirm = confirm
        self.stats = ClientStats()
        self.slots: SlotTable[_Call] = SlotTable(concurrency or self.settings.client_concurrency)
        self._name = name
        self._exchange = p.req_exchange(pool)
        self._tag = os.urandom(4).hex()
        self._outbox: deque[_Call] = deque()
        self._submit_lock = threading.Lock()  # orders submit's enqueue against close
        self._wake_pending = False
        self._wake_lock = threading.Lock()
        self._deadlines: list[tuple[float, int, int]] = []
        self._unconfirmed: dict[int, _Call] = {}
        self._publish_seq = 0
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._reply_queue = ""
        self._frame_max = pika.spec.FRAME_MAX_SIZE
        self._closing = False
        self._ready = threading.Event()
        self._setup_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-io", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._setup_error is not None:
            self._thread.join()
            raise self._setup_error

    # -- caller threads ---------------------------------------------------------------------
    def submit(self, key: str, body: bytes | str, timeout: float | None, expiration_ms: int | None,
               headers: Mapping[str, Any] | None, reply: bool = True) -> Future:
        timeout = self.default_timeout if timeout is None else timeout
        call = self._encode(key, body, timeout, expiration_ms, headers, reply)
        if self._closing:
            raise ClientClosedError("the client is closed")
        on_io_thread = threading.current_thread() is self._thread
        taken = self.slots.acquire(call, 0 if on_io_thread else timeout)
        if taken is None:
            raise ClientBusyError(
                f"all {self.slots.size} slots stayed busy for {timeout:.3g}s; "
                "raise the client's concurrency or add workers"
            )
        call.slot, call.seq = taken
        call.props.correlation_id = f"{self._tag}.{call.slot}.{call.seq}"
        with self._submit_lock:
            if self._closing:  # close() won the race: the I/O thread may have drained already
                self.slots.complete(call.slot, call.seq)
                raise ClientClosedError("the client is closed")
            self._outbox.append(call)
        if not on_io_thread:
            self._wake()
        return call.future

    def _encode(self, key: str, body: bytes | str, timeout: float, expiration_ms: int | None,
                headers: Mapping[str, Any] | None, reply: bool) -> _Call:
        """Validate a request and build its properties, so a bad one fails here, for its caller."""
        p.validate_key(key)
        if isinstance(body, str):
            body = body.encode("utf-8")
        elif isinstance(body, bytearray | memoryview):
            body = bytes(body)
        elif not isinstance(body, bytes):
            raise TypeError(f"a request body must be bytes or str, not {type(body).__name__}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) \
                or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if expiration_ms is None:
            expiration_ms = max(1, int(timeout * 1000))
        elif isinstance(expiration_ms, bool) or not isinstance(expiration_ms, int) or expiration_ms < 0:
            raise ValueError(f"expiration_ms must be a non-negative integer, got {expiration_ms!r}")
        if headers is not None and not isinstance(headers, Mapping):
            raise TypeError(f"headers must be a mapping, not {type(headers).__name__}")
        msg_headers = {**headers, p.KEY_HEADER: key} if headers else {p.KEY_HEADER: key}
        props = pika.BasicProperties(
            reply_to=self._reply_queue if reply else None,
            expiration=str(expiration_ms) if expiration_ms else None,  # 0: never expires
            headers=msg_headers,
            delivery_mode=pika.DeliveryMode.Persistent,
        )
        if headers:  # only the caller's headers can hold what AMQP cannot encode
            try:
                size = sum(len(piece) for piece in props.encode())
            except Exception as exc:
                raise ValueError(f"request headers cannot be encoded in AMQP: {type(exc).__name__}: {exc}"
                                 ) from exc
        else:
            size = 256 + len(key.encode("utf-8"))  # the fixed properties and the key header
        if size + _CID_ROOM + _FRAME_OVERHEAD > self._frame_max:
            raise ValueError(f"request properties and headers take {size} bytes: more than the "
                             f"broker's frame size ({self._frame_max} bytes) can carry")
        return _Call(key, p.routing_key(key), body, timeout, props, Future(), reply=reply)

    def close(self) -> None:
        with self._submit_lock:
            if self._closing:
                return
            self._closing = True
        self._wake()
        if threading.current_thread() is not self._thread:  # a done-callback must not join itself
            self._thread.join(10)

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_pending or self._connection is None:
                return
            self._wake_pending = True
            connection = self._connection
        try:
            connection.add_callback_threadsafe(self._on_wake)
        except pika.exceptions.ConnectionWrongStateError:
            # Closed: the loop notices and reconnects; the next wake must not be swallowed.
            self._on_wake()

    def _on_wake(self) -> None:
        with self._wake_lock:
            self._wake_pending = False

    # -- I/O thread -------------------------------------------------------------------------
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
            except Exception as exc:  # a bug must not end the loop: fail what is in flight, go on
                logger.exception("client I/O failed; reopening the channel", extra={"pool": self.pool})
                self._fail_all(RpcError(f"the client's I/O failed: {type(exc).__name__}: {exc}"))
        self._fail_all(ClientClosedError("the client was closed while the call was in flight"))
        self._shutdown_connection()

    def _open(self) -> None:
        if self._connection is None or not self._connection.is_open:
            self._connection = connect(self.settings.connections.amqp_url, self._name)
            self._frame_max = frame_max(self._connection)
            self._on_wake()  # a wake sent to the lost connection will never be dispatched
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
        # On the underlying channel, so that returns run as their frames arrive, like confirms: the
        # broker sends a mandatory message's return before its ack, and a send settled by the ack
        # must see it (BlockingChannel would queue the return until process_data_events dispatches).
        channel._impl.add_on_return_callback(self._on_return)
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
            props = call.props
            if call.reply and props.reply_to != self._reply_queue:  # encoded before a reconnect
                props.reply_to = self._reply_queue
            if self.confirm:  # record before publishing: basic_publish may process the confirm
                self._publish_seq += 1
                self._unconfirmed[self._publish_seq] = call
            try:
                publish_buffered(channel, self._exchange, call.routing_key, call.body, props, mandatory=True)
            except Exception as exc:  # nothing was written for this call: it fails alone
                if self.confirm:
                    self._unconfirmed.pop(self._publish_seq, None)
                    self._publish_seq -= 1
                if isinstance(exc, pika.exceptions.AMQPError) and not channel.is_open:
                    raise
                if self.slots.complete(call.slot, call.seq) is not None:
                    call.future.set_exception(RpcError(f"request for key {call.key!r} could not be sent: "
                                                       f"{type(exc).__name__}: {exc}"))
                continue
            self.stats.published += 1
            if not call.reply and not self.confirm:  # written: all an unconfirmed send waits for
                self._settle_sent(call)
                continue
            heapq.heappush(self._deadlines, (now + call.timeout, call.slot, call.seq))
        if len(self._deadlines) > 4 * self.slots.size + 1024:
            # Answered calls leave their deadline behind; drop those so the heap stays small.
            self._deadlines = [d for d in self._deadlines if self.slots.holds(d[1], d[2])]
            heapq.heapify(self._deadlines)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, slot, seq = heapq.heappop(self._deadlines)
            call = self.slots.complete(slot, seq)
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
        call = self.slots.complete(*parsed)
        if call is None:
            # A late response to a call that timed out: its slot may already serve another call.
            self.stats.stale_responses += 1
            return
        self.stats.responses += 1
        headers = props.headers or {}
        status = _header_str(headers.get(p.STATUS_HEADER, p.Status.OK))
        call.future.set_result(Response(status, body, props.correlation_id, headers))

    def _on_return(self, _channel: object, method: pika.spec.Basic.Return,
                   props: pika.BasicProperties, _body: bytes) -> None:
        parsed = self._parse_correlation_id(props.correlation_id)
        call = self.slots.complete(*parsed) if parsed else None
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
            if call is None:
                continue
            if nack:
                if self.slots.complete(call.slot, call.seq) is not None:
                    self.stats.nacked += 1
                    call.future.set_exception(PublishRejectedError(
                        f"the broker refused the request for key {call.key!r}"))
            elif not call.reply:  # a return came before this ack (see _open) and failed it already
                self._settle_sent(call)

    def _settle_sent(self, call: _Call) -> None:
        if self.slots.complete(call.slot, call.seq) is not None:
            self.stats.sent += 1
            call.future.set_result(None)

    def _fail_all(self, error: Exception) -> None:
        self._outbox.clear()
        self._deadlines.clear()
        self._unconfirmed.clear()
        channel, self._channel = self._channel, None
        if channel is not None and channel.is_open:  # reopened below: do not leak this one
            with contextlib.suppress(Exception):
                channel.close()
        for call in self.slots.drain():
            if not call.future.done():
                call.future.set_exception(error)

    def _shutdown_connection(self) -> None:
        with self._wake_lock:
            connection, self._connection = self._connection, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()
