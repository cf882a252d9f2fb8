"""The client's connection: one connection, one channel and one reply queue, reconnecting on loss.

pika is not thread-safe, so one lock (``_io_lock``) admits one thread at a time to the connection:
the driver. A blocking ``call`` drives it itself when nobody else does: it publishes, waits for
its response and takes it, with no hand-off between threads (each hand-off cost a wake-up, twice
per call). Otherwise the caller leaves its request in the outbox and wakes the driver, the I/O
thread or another caller, which publishes it (``wake_threadsafe`` ends its wait). The I/O
thread drives while calls are in flight and nobody else does, and owns setup and reconnection;
idle, it parks and takes a turn every ``_MAX_LOOP_WAIT`` for heartbeats. See ``rpc_client`` for
the threading and reclaim rules.

A lost connection fails no call that can still be answered in time: it reconnects (to another node
of a cluster, ``amqp.connect``) and sends the calls in flight again (``resend``).

A turn is one pass of pika's loop (``amqp.LoopPasses``): responses reach ``_on_response`` as their
frames arrive (a direct consumer), one timer bounds the wait by the earliest deadline, and a
request is sent when published (``amqp.written_together``), not when the next pass finds the
socket writable.
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
from typing import Any, cast

import pika
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from switchyard.core.errors import BrokerUnavailableError
from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.amqp import (
    LoopPasses,
    close_reason,
    close_soon,
    connect,
    consume_direct,
    enable_async_confirms,
    frame_max,
    on_return_direct,
    publish_buffered,
    wake_threadsafe,
    written_together,
)
from switchyard.rpc.client.requests import Call, encode_request, parse_correlation_id
from switchyard.rpc.client.resend import interrupt_overdue, published_in_flight
from switchyard.rpc.client.response import ClientStats, Response, status_of
from switchyard.rpc.client.slots import SlotTable
from switchyard.rpc.errors import (
    CallError,
    CallTimeoutError,
    ClientBusyError,
    ClientClosedError,
    ClientThreadError,
    PoolNotFoundError,
    PublishRejectedError,
    UnroutableError,
)
from switchyard.rpc.settings import RpcSettings

_MAX_LOOP_WAIT = 0.2
_RECONNECT_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)


class _ClientCore:
    """The state the I/O thread works on. It holds no reference to its ``RpcClient``."""

    def __init__(self, pool: str, settings: RpcSettings, concurrency: int | None, timeout: float | None,
                 confirm: bool, name: str) -> None:
        self.pool = protocol.validate_pool(pool)
        self.settings = settings
        self.default_timeout = timeout if timeout is not None else self.settings.call_timeout
        self.confirm = confirm
        self.stats = ClientStats()
        self.slots: SlotTable[Call] = SlotTable(concurrency or self.settings.client_concurrency)
        self._name = name
        self._exchange = protocol.req_exchange(pool)
        self._tag = os.urandom(4).hex()
        self._outbox: deque[Call] = deque()
        self._submit_lock = threading.Lock()  # orders submit's enqueue against close
        self._wake_pending = False
        self._wake_lock = threading.Lock()
        self._io_lock = threading.Lock()  # held by the thread using the connection
        self._driver: int | None = None  # that thread's ident, while it drives
        self._driver_error: Exception | None = None  # a caller's drive failed: the I/O thread handles it
        self._kick = threading.Event()  # wakes the parked I/O thread
        self._last_turn = 0.0  # when a thread last exchanged frames (monotonic)
        self._deadlines: list[tuple[float, int, int]] = []
        self._passes: LoopPasses | None = None  # the connection's loop, bounded by a timer
        self._unconfirmed: dict[int, Call] = {}
        self._publish_seq = 0
        self._generation = 0  # counts the connections opened: a call is published once on each
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
               headers: Mapping[str, Any] | None, reply: bool = True, slot_wait: float | None = None) -> Call:
        """Queue a request; its ``future`` settles it. ``slot_wait``: how long to wait for a slot (default:
        the timeout; the asyncio client waits on its loop and passes 0)."""
        call = self._enqueue(key, body, timeout, expiration_ms, headers, reply, slot_wait)
        if not self._on_io():
            self._wake()
        return call

    def call(self, key: str, body: bytes | str, timeout: float | None, expiration_ms: int | None,
             headers: Mapping[str, Any] | None) -> Response:
        """``submit`` and wait, driving the connection in this thread if nobody else drives it."""
        if self._on_io():  # waiting here would hold the thread the response needs, until the timeout
            raise ClientThreadError("call() from a done-callback waits on itself: use submit() and chain "
                                    "another done-callback, or call from a thread of your own")
        call = self._enqueue(key, body, timeout, expiration_ms, headers, True)
        if not self._drive_until(call.future):
            self._wake()
        # The driver enforces the timeout; the margin only guards against a dead I/O thread.
        return cast(Response, call.future.result(call.timeout + 5.0))

    def _enqueue(self, key: str, body: bytes | str, timeout: float | None, expiration_ms: int | None,
                 headers: Mapping[str, Any] | None, reply: bool, slot_wait: float | None = None) -> Call:
        """Encode a request (a bad one raises here, for its caller), take a slot, queue it."""
        timeout = self.default_timeout if timeout is None else timeout
        call = encode_request(key, body, timeout, expiration_ms, headers, reply=reply,
                              reply_queue=self._reply_queue, frame_max=self._frame_max)
        if self._closing:
            raise ClientClosedError("the client is closed")
        taken = self.slots.acquire(call, 0 if self._on_io() else timeout if slot_wait is None else slot_wait)
        if taken is None:
            raise ClientBusyError(
                f"all {self.slots.size} slots stayed busy for {timeout:.3g}s; "
                "raise the client's concurrency or add workers"
            )
        call.slot, call.seq = taken
        call.deadline = time.monotonic() + timeout
        call.props.correlation_id = f"{self._tag}.{call.slot}.{call.seq}"
        with self._submit_lock:
            if self._closing:  # close() won the race: the I/O thread may have drained already
                self.slots.complete(call.slot, call.seq)
                raise ClientClosedError("the client is closed")
            self._outbox.append(call)
        return call

    def _on_io(self) -> bool:
        """Whether this thread drives the connection (a done-callback, the I/O thread): it must not
        wait for a slot or for a response, since it is the thread that would free them."""
        me = threading.get_ident()
        return me == self._driver or me == self._thread.ident

    def _drive_until(self, future: Future) -> bool:
        """Drive the connection until ``future`` is done, if no other thread drives it (False)."""
        if not self._io_lock.acquire(blocking=False):
            return False
        try:
            channel = self._channel
            if self._closing or self._driver_error is not None or channel is None or not channel.is_open:
                return False  # reconnecting or closing: the I/O thread's business
            self._driver = threading.get_ident()
            try:
                while not future.done() and not self._closing:
                    self._turn(_MAX_LOOP_WAIT)
            except Exception as exc:  # the I/O thread fails what is in flight and reconnects
                self._driver_error = exc
            finally:
                self._driver = None
            return True
        finally:
            self._io_lock.release()
            if self._has_work() or self._driver_error is not None:
                self._kick.set()

    def _has_work(self) -> bool:
        return bool(self._outbox or self.slots.in_use() or self._unconfirmed or self._closing)

    def close(self) -> None:
        with self._submit_lock:
            if self._closing:
                return
            self._closing = True
        self._wake()
        if not self._on_io():  # a done-callback must not wait for the thread it runs on
            self._thread.join(10)

    def _wake(self) -> None:
        self._kick.set()
        with self._wake_lock:
            if self._wake_pending or self._connection is None:
                return
            self._wake_pending = True
            connection = self._connection
        try:
            wake_threadsafe(connection, self._on_wake)
        except pika.exceptions.ConnectionWrongStateError:
            # Closed: the loop notices and reconnects; the next wake must not be swallowed.
            self._on_wake()

    def _on_wake(self) -> None:
        with self._wake_lock:
            self._wake_pending = False

    # -- I/O thread -------------------------------------------------------------------------
    def _run(self) -> None:
        with self._io_lock:  # released only while parked (in _serve)
            self._run_locked()

    def _run_locked(self) -> None:
        attempt = 0
        while not self._closing:
            try:
                self._open()
            except Exception as exc:
                if not self._ready.is_set():
                    self._setup_error = exc
                    self._ready.set()
                    return
                if isinstance(exc, PoolNotFoundError):  # no exchange to re-send to
                    self._fail_all(exc)
                self._await_reconnect(_RECONNECT_DELAYS[min(attempt, len(_RECONNECT_DELAYS) - 1)], exc)
                attempt += 1
                continue
            attempt = 0
            self._ready.set()
            try:
                self._serve()
            except pika.exceptions.ChannelClosedByBroker as exc:
                error: Exception = (
                    PoolNotFoundError(f"pool {self.pool!r} is not initialized: {exc.reply_text}")
                    if exc.reply_code == protocol.NOT_FOUND
                    else BrokerUnavailableError(f"channel closed by the broker: {exc.reply_text}")
                )
                logger.warning("client channel closed; reopening", extra={"pool": self.pool,
                                                                          "reason": exc.reply_text})
                self._fail_all(error)
            except pika.exceptions.AMQPError as exc:
                logger.warning("client connection lost; reconnecting", extra={"pool": self.pool,
                                                                             "error": repr(exc)})
                self._resend_in_flight(exc)
            except Exception as exc:  # a bug must not end the loop: fail what is in flight, go on
                logger.exception("client I/O failed; reopening the channel", extra={"pool": self.pool})
                self._fail_all(CallError(f"the client's I/O failed: {type(exc).__name__}: {exc}"))
        self._fail_all(ClientClosedError("the client was closed while the call was in flight"))
        self._shutdown_connection()

    def _open(self) -> None:
        if self._connection is None or not self._connection.is_open:
            self._connection = connect(self.settings.connections.amqp_url, self._name)
            self._frame_max = frame_max(self._connection)
            self._on_wake()  # a wake sent to the lost connection will never be dispatched
            self._passes = LoopPasses(self._connection)
        channel = self._connection.channel()
        self._generation += 1  # a new reply queue: the calls in flight are published again
        try:
            channel.exchange_declare(self._exchange, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == protocol.NOT_FOUND:
                raise PoolNotFoundError(
                    f"pool {self.pool!r} is not initialized (no exchange {self._exchange!r}); "
                    f"run: switchyard pool init --pool {self.pool}"
                ) from exc
            raise
        result = channel.queue_declare("", exclusive=True, auto_delete=True)
        self._reply_queue = result.method.queue
        consume_direct(channel, self._reply_queue, self._on_response, auto_ack=True,
                       on_cancel=lambda: self._on_reply_queue_lost(channel))
        on_return_direct(channel, self._on_return)  # run as they arrive: before the ack that settles
        self._publish_seq = 0
        self._unconfirmed.clear()
        if self.confirm:
            enable_async_confirms(channel, self._on_confirm)
        self._channel = channel

    def _serve(self) -> None:
        """Drive while there is work and no caller drives; park otherwise. Holds ``_io_lock`` but
        while parked."""
        me = threading.get_ident()
        while not self._closing:
            self._driver = me
            try:
                self._turn(0)  # heartbeats, a close from the broker, a stray response
                while True:
                    self._kick.clear()  # before the check: a kick after it is not lost
                    if not self._has_work() or self._closing:
                        break
                    self._turn(_MAX_LOOP_WAIT)
            finally:
                self._driver = None
            self._io_lock.release()
            self._park()
            if self._driver_error is not None:
                error, self._driver_error = self._driver_error, None
                raise error

    def _park(self) -> None:
        """Wait for a kick or ``_MAX_LOOP_WAIT``, then take ``_io_lock``. While a caller drives, do
        not queue for the lock (its release would hand this thread the next call): the caller does
        the I/O, and kicks when it leaves work behind."""
        while True:
            kicked = self._kick.wait(_MAX_LOOP_WAIT)
            self._kick.clear()  # before trying: a kick after a failed try is not lost
            if not kicked and time.monotonic() - self._last_turn < _MAX_LOOP_WAIT:
                continue  # a caller took a turn lately: heartbeats are going
            if self._io_lock.acquire(blocking=False):
                return

    def _turn(self, max_wait: float) -> None:
        """One I/O turn: publish the outbox (written at once), exchange frames, expire calls past
        their deadline. Waits at most ``max_wait`` or until the earliest deadline."""
        # Called only after _open succeeded.
        connection = cast("pika.BlockingConnection", self._connection)
        if self._outbox:
            with written_together(connection):
                self._flush_outbox()
        if max_wait <= 0:  # a look without waiting; also dispatches connection-level events
            connection.process_data_events(time_limit=0)
        else:
            until = time.monotonic() + max_wait
            if self._deadlines:
                until = min(until, self._deadlines[0][0])
            cast(LoopPasses, self._passes).run(until)
        self._last_turn = time.monotonic()
        if self._deadlines and self._deadlines[0][0] <= time.monotonic():
            self._expire()
        if self._channel is None or not self._channel.is_open:
            reason = close_reason(self._channel) if self._channel is not None else None
            if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
                raise reason
            raise pika.exceptions.ChannelClosedByBroker(0, f"channel closed: {reason!r}")

    def _flush_outbox(self) -> None:
        channel = cast(BlockingChannel, self._channel)  # set by _open before the loop runs
        outbox = self._outbox
        while outbox:
            call = outbox.popleft()
            if call.future.done() or call.published_on == self._generation:  # failed, or queued twice
                continue
            call.published_on = self._generation  # before publishing: a publish that raises is re-sent
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
                    call.future.set_exception(CallError(f"request for key {call.key!r} could not be sent: "
                                                       f"{type(exc).__name__}: {exc}"))
                continue
            self.stats.published += 1
            call.attempts += 1
            if not call.reply and not self.confirm:  # written: all an unconfirmed send waits for
                self._settle_sent(call)
                continue
            if call.attempts > 1:  # its deadline is in the heap since its first publish
                self.stats.resent += 1
                continue
            heapq.heappush(self._deadlines, (call.deadline, call.slot, call.seq))
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

    def _on_response(self, _channel: BlockingChannel, _method: pika.spec.Basic.Deliver,
                     props: pika.BasicProperties, body: bytes) -> None:
        parsed = parse_correlation_id(self._tag, props.correlation_id)
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
        call.future.set_result(Response(status_of(headers), body, props.correlation_id, headers))

    def _on_reply_queue_lost(self, channel: BlockingChannel) -> None:
        """The broker cancelled the reply consumer (someone deleted the queue): no answer can come.
        Closing the channel makes the turn fail what is in flight and open a new reply queue."""
        logger.warning("reply queue deleted by someone else; reopening", extra={"pool": self.pool})
        if channel.is_open:
            close_soon(channel)

    def _on_return(self, _channel: object, method: pika.spec.Basic.Return,
                   props: pika.BasicProperties, _body: bytes) -> None:
        parsed = parse_correlation_id(self._tag, props.correlation_id)
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

    def _settle_sent(self, call: Call) -> None:
        if self.slots.complete(call.slot, call.seq) is not None:
            self.stats.sent += 1
            call.future.set_result(None)

    def _resend_in_flight(self, lost: Exception) -> None:
        """The calls a lost connection published go back to the front of the outbox (``resend``)."""
        self._unconfirmed.clear()  # their confirms died with the channel
        self._drop_channel()
        with self._submit_lock:  # _enqueue appends under it: no call is queued twice meanwhile
            self._outbox.extendleft(reversed(published_in_flight(self.slots)))
        interrupt_overdue(self.slots, self.stats, lost, _MAX_LOOP_WAIT)

    def _await_reconnect(self, delay: float, why: Exception) -> None:
        """Wait ``delay`` s to connect again, failing the calls whose deadline comes meanwhile."""
        until = time.monotonic() + delay
        while not self._closing:
            next_deadline = interrupt_overdue(self.slots, self.stats, why, _MAX_LOOP_WAIT)
            now = time.monotonic()
            if now >= until:
                return
            self._kick.wait(min(until, next_deadline) - now)
            self._kick.clear()

    def _fail_all(self, error: Exception) -> None:
        self._outbox.clear()
        self._deadlines.clear()
        self._unconfirmed.clear()
        self._drop_channel()
        for call in self.slots.drain():
            if not call.future.done():
                call.future.set_exception(error)

    def _drop_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None and channel.is_open:  # reopened next: do not leak this one
            with contextlib.suppress(Exception):
                channel.close()

    def _shutdown_connection(self) -> None:
        with self._wake_lock:
            connection, self._connection = self._connection, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()
