"""The pending request queue on Redis: RPC from any node to a polling service connected to one node.

One ``PendingQueue`` per process (a node). A caller anywhere runs ``queue_and_wait(endpoint, ...)``;
the node a polling service is connected to runs ``dequeue(endpoint)`` for it and, once the service
answered, ``apply_response(...)``. The request moves through Redis; see the README's "Pending
request queue" section and the Lua scripts in ``switchyard/pending/lua/`` for the key layout.

Better than Halibut's (seed 002):

* every multi-step change is one Lua script (enqueue, respond, heartbeat, withdraw; the claim runs
  inside respond and heartbeat): a crash between two steps never leaves a key without a TTL or a
  request nobody owns, and each script is idempotent, so redis-py's retries are safe;
* a poller waits in a blocking pop (BLMOVE) that moves the whole request from the endpoint's list
  into a take key of its own, with a TTL: Redis wakes one poller per request and hands it the
  request, with no pulse and no read; a crash after the pop leaves the request where the caller
  finds it, and a pop whose reply was lost is found in its take key by the retry; the claim
  (state taken, processor recorded) is lazy: the response claims a request answered quickly, the
  first heartbeat one still running (``lua/claim.lua``);
* one pub/sub connection per node instead of subscriptions per request: the node channel brings
  responses (with the response inside, so no read) and cancellations; the thread waiting for a
  response reads the connection itself when no other thread does (``subscriber.py``), so a call
  made one at a time crosses no thread hand-off;
* heartbeats are timestamps in the request's state written by Lua with Redis's clock: one command
  per interval both beats and checks the other side, the caller's beat is also its pickup check
  and response poll, and a lost pub/sub message cannot look like a dead node;
* the fast-RPC shortcut: nothing periodic happens before ``heartbeat_initial_delay_s`` (the claim
  before ``CLAIM_DELAY_S``), so a quick call costs two scripts (enqueue, respond), one blocking pop
  and a share of one batched UNLINK;
* under load a node's concurrent enqueues and responds share round trips (``batch.py``):
  with redis-py each round trip costs more Python CPU than the Lua work it carries;
* redis-py's own Retry repeats every command for the retry window (30 s, 1 s apart).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from typing import Any, BinaryIO

import redis

from switchyard.core.observability import emit_gauge
from switchyard.pending.batch import ScriptBatcher, Signal
from switchyard.pending.errors import (
    CancelledError,
    DataLossError,
    MessageTooLargeError,
    PendingError,
    PickupTimeoutError,
    ProcessorLostError,
    QueueUnavailableError,
    RemoteError,
)
from switchyard.pending.settings import PendingSettings, check_endpoint, connect_pending_redis
from switchyard.pending.storage import StreamRef, StreamStore, store_from_uri
from switchyard.pending.subscriber import SharedSubscriber

logger = logging.getLogger(__name__)

ID_LENGTH = 32  # request ids are fixed-length, so node-channel messages need no parsing
RESPONSE_MESSAGE = b"r"  # node channel: b"r" + id + b"\n" + response JSON
CANCEL_MESSAGE = b"c"  # node channel, or endpoint channel while unclaimed: b"c" + id
# A popped request still running this long after the pop is claimed by its processor's first
# heartbeat (capped by ``heartbeat_initial_delay_s``); one answered sooner, by its response.
CLAIM_DELAY_S = 1.0
# Answered states are unlinked in batches, off the callers' path: at most this late (their TTL
# covers a node that dies first) or as soon as this many piled up. One UNLINK per endpoint tag.
REAP_INTERVAL_S = 0.1
REAP_BATCH = 256
# Metrics (Count, dimension Endpoint; the CDK alarms watch them). Data loss has no endpoint.
METRIC_PICKUP_TIMEOUTS = "PendingPickupTimeouts"
METRIC_PROCESSORS_LOST = "PendingProcessorsLost"
METRIC_REQUEUED = "PendingRequestsRequeued"  # popped, never claimed within the processor timeout
METRIC_UNDELIVERED = "PendingResponsesUndelivered"  # abandoned / cancelled / gone
METRIC_DATA_LOSS = "PendingDataLossEvents"
METRIC_DROPPED = "PendingRequestsDropped"  # a pending-list element no caller wrote (no id to answer)


def _count(metric: str, endpoint: str = "*") -> None:
    emit_gauge(metric, 1, "Endpoint", endpoint)


class Delivery(StrEnum):
    """What ``apply_response`` did (the values respond.lua returns)."""

    DELIVERED = "delivered"
    CANCELLED = "cancelled"  # the caller cancelled: the response was dropped
    ABANDONED = "abandoned"  # the caller stopped heartbeating: the response was dropped
    GONE = "gone"  # no such request in Redis (data loss, or it expired)
    NOT_TAKER = "not_taker"  # this take no longer holds the request


class CancelToken:
    """A cancellation signal with a reason; callbacks run once, on the cancelling thread."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[str], None]] = []
        self.reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(reason)

    def cancel_after(self, seconds: float, reason: str = "timed out") -> threading.Timer:
        """Cancel in ``seconds`` unless cancelled before (a call deadline)."""
        timer = threading.Timer(seconds, self.cancel, args=(f"{reason} after {seconds:g} s",))
        timer.daemon = True
        timer.start()
        return timer

    def is_cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def on_cancel(self, callback: Callable[[str], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback(self.reason or "cancelled")

    def remove(self, callback: Callable[[str], None]) -> None:
        """Forget a callback (a call that ended): one token may serve many calls."""
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)


@dataclass
class PendingRequest:
    """A request a processing node took; answer it with ``apply_response``."""

    id: str
    endpoint: str
    take_id: str
    body: Any
    streams: list[StreamRef]
    caller: str
    enqueued_at_ms: int
    cancel: CancelToken = field(default_factory=CancelToken, repr=False)

    def to_json(self) -> dict[str, Any]:
        """What the HTTP long poll hands a polling service."""
        return {"id": self.id, "take": self.take_id, "body": self.body,
                "streams": [s.to_json() for s in self.streams], "enqueued_at_ms": self.enqueued_at_ms}


@dataclass(frozen=True)
class Response:
    """A successful response: its JSON body and stream references (read them from the store)."""

    body: Any
    streams: list[StreamRef]


@dataclass(frozen=True)
class Reply:
    """A handler's answer with streams (a plain return value is the body alone)."""

    body: Any = None
    streams: Mapping[str, bytes | BinaryIO] | None = None


Handler = Callable[[PendingRequest], Any]


def store_streams(store: StreamStore | None,
                  streams: Mapping[str, bytes | BinaryIO] | None) -> list[StreamRef]:
    """Put ``streams`` in ``store``; their references (messages carry references, never bytes)."""
    if not streams:
        return []
    if store is None:
        raise PendingError("streams need a store: set SWITCHYARD_PENDING_STORE")
    return [store.put(name, data) for name, data in streams.items()]


def handler_message(handler: Callable[[Any], Any], request: Any, store: StreamStore | None) -> dict[str, Any]:
    """Run a service's handler; the response message for its answer (streams stored), or for its
    failure (any exception: it is this request's problem only)."""
    try:
        result = handler(request)
        if not isinstance(result, Reply):
            result = Reply(result)
        streams = [ref.to_json() for ref in store_streams(store, result.streams)]
        return {"ok": True, "body": result.body, "streams": streams}
    except Exception as exc:
        logger.exception("handler failed for request %s", request.id)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


@dataclass(frozen=True)
class ProcessorBeat:
    """What a processor's heartbeat learned: whether to stop working on the request, and why."""

    cancelled: bool
    reason: str | None = None


@dataclass
class _Call:
    id: str
    endpoint: str
    element: bytes  # its pending-list element (a withdrawal removes it by value)
    event: Signal = field(default_factory=Signal)  # one waiter: the calling thread
    response: bytes | None = None
    error: PendingError | None = None
    recheck: bool = False
    taken: bool = False
    requeued: bool = False  # a beat put it back in the pending list: its pickup timeout starts again
    cancel_reason: str | None = None

    def ready(self) -> bool:
        """Something for the calling thread to act on (each is written before ``event`` is set)."""
        return (self.response is not None or self.error is not None or self.cancel_reason is not None
                or self.recheck)


@dataclass
class _Tracked:
    request: PendingRequest
    next_beat: float


def _script(client: redis.Redis, name: str, claims: bool = False) -> Any:
    """Register a script; ``claims``: it calls claim() (``lua/claim.lua`` is prepended)."""
    lua = resources.files("switchyard.pending.lua")
    prelude = lua.joinpath("claim.lua").read_text() if claims else ""
    return client.register_script(prelude + lua.joinpath(name).read_text())


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PendingQueue:
    """One node of the pending request queue (caller side and processing side)."""

    def __init__(
        self,
        settings: PendingSettings | None = None,
        *,
        client: redis.Redis | None = None,
        store: StreamStore | None = None,
        node_id: str | None = None,
        on_step: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings or PendingSettings.from_env()
        self.client = client or connect_pending_redis(self.settings)
        self.store = store if store is not None else store_from_uri(
            self.settings.store, self.settings.connections.aws_endpoint_url)
        self.node_id = node_id or uuid.uuid4().hex
        self._on_step = on_step
        prefix = self.settings.prefix
        self.node_channel_prefix = f"{prefix}:node:"
        self.node_channel = f"{self.node_channel_prefix}{self.node_id}"
        self._guard_key = f"{prefix}:guard:{self.node_id}"
        self._guard_token = uuid.uuid4().hex
        # Request and take ids: a random prefix of this process + a counter (32 hex digits, as a
        # uuid4's): unique without a system call per id (uuid4's urandom was 7% of a busy service
        # node's CPU). Random, not the node id: a node restarted with the same id starts afresh.
        self._id_prefix = uuid.uuid4().hex[:20]
        self._id_counter = itertools.count()
        self._enqueue = _script(self.client, "enqueue.lua")
        self._respond = _script(self.client, "respond.lua", claims=True)
        self._heartbeat = _script(self.client, "heartbeat.lua", claims=True)
        # Blocking pops hold their connection for up to a poll wait: each polling thread has a
        # connection of its own (the same server and options; no cap but the server's maxclients),
        # held while the thread lives, so pollers never starve callers of the bounded pool.
        pool = self.client.connection_pool
        self._pop_block_s = max(self.settings.poll_wait_s, self.settings.http_poll_wait_s)
        # A take key outlives the longest pop plus a retry window (its request is claimed long before)
        self._take_ttl_ms = _ms(self._pop_block_s + self.settings.retry_window_s + 90)
        self._poll_connection_args = (pool.connection_class, {
            **pool.connection_kwargs,
            "socket_timeout": self._pop_block_s + self.settings.connections.redis_timeout_s})
        self._poller = threading.local()
        self._poll_connections: weakref.WeakSet[Any] = weakref.WeakSet()  # close() interrupts their pops
        self._cancel_channels: dict[str, threading.Event] = {}  # endpoint -> its channel subscribed
        self._withdraw = _script(self.client, "withdraw.lua")
        self._give_back = _script(self.client, "give_back.lua")
        self._batch = ScriptBatcher(self.client)  # enqueues and responds of concurrent threads
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._unlinks: dict[str, list[str]] = {}  # key tag -> answered states to unlink
        self._unlink_count = 0
        self._unlink_wake = threading.Event()
        self._calls: dict[str, _Call] = {}
        self._tracked: dict[str, _Tracked] = {}
        self._node_ready = threading.Event()
        self._closed = threading.Event()
        # _on_message is looked up per message: a test makes a started node deaf by replacing it.
        self._subscriber = SharedSubscriber(self.client, self.node_channel, lambda m: self._on_message(m),
                                            self._on_subscriber_lost, self.settings.retry_interval_s,
                                            self._closed)
        self._threads: list[threading.Thread] = []
        self._guard_set_at: float | None = None  # wall-clock time the guard was last set
        self.data_loss_events = 0

    def _new_id(self) -> str:
        return f"{self._id_prefix}{next(self._id_counter):012x}"  # next() on a count is atomic

    # ------------------------------------------------------------------ keys

    def key_tag(self, endpoint: str) -> str:
        """Every key of one endpoint shares this Redis Cluster hash tag (one slot per endpoint)."""
        return f"{self.settings.prefix}:{{{check_endpoint(endpoint)}}}"

    def state_key(self, endpoint: str, request_id: str) -> str:
        return f"{self.key_tag(endpoint)}:r:{request_id}"

    def pending_key(self, endpoint: str) -> str:
        return f"{self.key_tag(endpoint)}:pending"

    def take_key(self, endpoint: str, take_id: str) -> str:
        return f"{self.key_tag(endpoint)}:t:{take_id}"

    def endpoint_channel(self, endpoint: str) -> str:
        """Cancellations of an endpoint's popped, not yet claimed requests (processor unknown)."""
        return f"{self.settings.prefix}:ep:{endpoint}"

    # ------------------------------------------------------------- lifecycle

    def start(self) -> PendingQueue:
        """Subscribe the node channel, start the data-loss watch; ready for calls when it returns.
        Starting a started node does nothing (the Lambda handler calls this on every invocation)."""
        with self._start_lock:
            if self._threads:
                return self
            self._redis(self._check_guard)  # sets the guard (first check)
            threads = ((self._subscriber.run, "listener"), (self._watch, "watchdog"), (self._reap, "reaper"))
            for target, name in threads:
                thread = threading.Thread(target=target, name=f"pending-{name}-{self.node_id[:8]}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)
            if not self._node_ready.wait(self.settings.retry_window_s):
                raise QueueUnavailableError("could not subscribe this node's channel within the retry window")
        return self

    def close(self) -> None:
        """Stop the background threads; in-flight calls fail, taken requests are cancelled."""
        self._closed.set()
        with self._lock:
            calls, tracked = list(self._calls.values()), list(self._tracked.values())
        for call in calls:
            call.error = call.error or PendingError("the pending queue was closed")
            call.event.set()
        for item in tracked:
            item.request.cancel.cancel("the pending queue was closed")
        with self._lock:
            polling = list(self._poll_connections)
        for connection in polling:  # a poller blocked in a pop ends now, not after its wait
            sock = connection._sock  # redis-py has no public way to interrupt a blocked read
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # the poller's own thread then disconnects
        self._unlink_wake.set()  # the reaper unlinks what is left, then ends
        for thread in self._threads:
            thread.join(5)
        self._threads.clear()
        self._batch.close()

    def __enter__(self) -> PendingQueue:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

    @staticmethod
    def _redis(operation: Callable[[], Any]) -> Any:
        """Run a Redis operation (redis-py already retried it for the window); map its failure."""
        try:
            return operation()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise QueueUnavailableError(f"Redis unreachable after retrying: {exc}") from exc

    # ------------------------------------------------------------ messages

    def _encode(self, message: dict[str, Any], what: str) -> bytes:
        try:
            raw = json.dumps(message, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{what} body is not JSON-serialisable: {exc}") from exc
        if len(raw) > self.settings.max_message_bytes:
            raise MessageTooLargeError(
                f"{what} is {len(raw)} bytes, over SWITCHYARD_PENDING_MAX_MESSAGE_BYTES="
                f"{self.settings.max_message_bytes}; send large data as streams")
        return raw

    def _store_streams(self, streams: Mapping[str, bytes | BinaryIO] | None) -> list[StreamRef]:
        return store_streams(self.store, streams)

    @staticmethod
    def _decode_response(request_id: str, raw: bytes) -> Response:
        try:
            message = json.loads(raw)
            ok = bool(message["ok"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PendingError(f"request {request_id}: unreadable response {raw[:200]!r}") from exc
        if not ok:
            raise RemoteError(f"request {request_id}: the service failed: {message.get('error')}")
        return Response(message.get("body"), [StreamRef.from_json(s) for s in message.get("streams") or []])

    # ---------------------------------------------------------- caller side

    def queue_and_wait(
        self,
        endpoint: str,
        body: Any = None,
        *,
        streams: Mapping[str, bytes | BinaryIO] | None = None,
        pickup_timeout: float | None = None,
        cancel: CancelToken | None = None,
    ) -> Response:
        """Send ``body`` (JSON) to the polling service of ``endpoint``; block until it answers.

        Raises PickupTimeoutError, ProcessorLostError, DataLossError, CancelledError (``cancel``
        fired), RemoteError (the service failed) or QueueUnavailableError.
        """
        if not self._threads:
            raise PendingError("start() the PendingQueue before calling")
        check_endpoint(endpoint)
        s = self.settings
        refs = self._store_streams(streams)
        try:
            message = self._encode({"body": body, "streams": [r.to_json() for r in refs]}, "request")
            return self._call(endpoint, message, pickup_timeout or s.pickup_timeout_s, cancel)
        finally:
            for ref in refs:
                self._delete_stream(ref)

    def _delete_stream(self, ref: StreamRef) -> None:
        try:
            self.store.delete(ref)  # type: ignore[union-attr]
        except Exception:  # a leftover stream is the store's lifecycle rule's to expire
            logger.warning("could not delete stream %s", ref.id, exc_info=True)

    def _call(self, endpoint: str, message: bytes, pickup_timeout: float,
              cancel: CancelToken | None) -> Response:
        s = self.settings
        request_id = self._new_id()
        element = b"%s %d %s\n%s" % (request_id.encode(), time.time() * 1000, self.node_id.encode(), message)
        call = _Call(request_id, endpoint, element)
        state_key = self.state_key(endpoint, call.id)
        with self._lock:
            self._calls[call.id] = call

        def on_cancel(reason: str) -> None:
            call.cancel_reason = reason
            call.event.set()

        if cancel is not None:
            cancel.on_cancel(on_cancel)
        try:
            self._step("before_enqueue")
            self._redis(lambda: self._batch.call(
                self._enqueue, [state_key, self.pending_key(endpoint)],
                [element, self.node_id, _ms(pickup_timeout + s.request_ttl_extra_s),
                 _ms(s.pending_list_ttl_s)]))
            self._step("enqueued")
            started = time.monotonic()
            pickup_deadline: float | None = started + pickup_timeout
            next_beat = started + s.heartbeat_initial_delay_s
            while True:
                wake_at = min(next_beat, pickup_deadline or next_beat)
                self._subscriber.wait(call.event, max(0.0, wake_at - time.monotonic()), call.ready)
                if call.response is not None:
                    return self._collect(call, state_key, call.response)
                if call.error is not None:
                    raise call.error
                if call.cancel_reason is not None:
                    return self._withdraw_call(call, state_key, "cancel")
                now = time.monotonic()
                if pickup_deadline is not None and now >= pickup_deadline:
                    pickup_deadline = None
                    answer = self._withdraw_call(call, state_key, "timeout")
                    if answer is not None:
                        return answer
                if call.recheck or now >= next_beat:
                    call.recheck = False
                    next_beat = now + s.heartbeat_interval_s
                    answer = self._caller_beat(call, state_key)
                    if answer is not None:
                        return answer
                    if call.taken:
                        pickup_deadline = None
                    if call.requeued:
                        call.requeued = False
                        pickup_deadline = now + pickup_timeout
        finally:
            with self._lock:
                self._calls.pop(call.id, None)
            if cancel is not None:
                cancel.remove(on_cancel)

    def _collect(self, call: _Call, state_key: str, raw: bytes) -> Response:
        """The call has its response: the answered state is unlinked off the caller's path (the
        reaper batches them); if this process dies first, the state's response TTL removes it."""
        self._step("before_collect")
        tag = state_key.rpartition(":r:")[0]
        with self._lock:
            self._unlinks.setdefault(tag, []).append(state_key)
            self._unlink_count += 1
            full = self._unlink_count >= REAP_BATCH
        if full:
            self._unlink_wake.set()
        self._step("collected")
        return self._decode_response(call.id, raw)

    def _reap(self) -> None:
        """Unlink answered states every REAP_INTERVAL_S (sooner when REAP_BATCH piled up): one round
        trip, one UNLINK per endpoint tag (its keys share one cluster slot), instead of one per call."""
        while True:
            self._unlink_wake.wait(REAP_INTERVAL_S)
            self._unlink_wake.clear()
            with self._lock:
                batches, self._unlinks, self._unlink_count = self._unlinks, {}, 0
            if batches:
                try:
                    with self.client.pipeline(transaction=False) as pipe:
                        for keys in batches.values():
                            pipe.unlink(*keys)
                        pipe.execute()
                except (redis.ConnectionError, redis.TimeoutError):
                    logger.warning("could not unlink %d answered states; their TTL will",
                                   sum(map(len, batches.values())))
            if self._closed.is_set():
                return

    def _caller_beat(self, call: _Call, state_key: str) -> Response | None:
        """Heartbeat + pickup check + response poll, one command; raises when the call is lost."""
        s = self.settings
        reply = self._redis(lambda: self._heartbeat(
            keys=[state_key, self.pending_key(call.endpoint)],
            args=["c", "", _ms(s.in_flight_ttl_s), call.element, _ms(s.processor_timeout_s),
                  _ms(s.pending_list_ttl_s)]))
        state = _text(reply[0])
        if state == "missing":
            self._state_vanished(call)
        if state == "a":
            return self._collect(call, state_key, reply[2])
        if state == "t":
            call.taken = True
        if state == "requeued":
            # Popped and never claimed for the processor timeout: the node that popped it died
            # before handing it over (SIGKILL mid long poll), so it was put back for another.
            logger.warning("request %s to %r: popped and never claimed for %g s; back in the queue",
                           call.id, call.endpoint, s.processor_timeout_s)
            _count(METRIC_REQUEUED, call.endpoint)
            call.requeued = True
        # Taken: ms since the processor's last beat.
        if int(reply[1]) > _ms(s.processor_timeout_s):
            self._redis(lambda: self._withdraw(keys=[state_key, self.pending_key(call.endpoint)],
                                               args=self._withdraw_args(call, "cancel")))
            _count(METRIC_PROCESSORS_LOST, call.endpoint)
            raise ProcessorLostError(
                f"request {call.id} to {call.endpoint!r}: the node processing it sent no heartbeat for "
                f"{int(reply[1]) / 1000:.0f} s (limit {s.processor_timeout_s:g} s); presumed offline")
        return None

    def _withdraw_args(self, call: _Call, mode: str) -> list[Any]:
        return [call.id, mode, self.node_channel_prefix, call.element, self.endpoint_channel(call.endpoint)]

    def _state_vanished(self, call: _Call) -> None:
        if self.check_data_loss():
            raise DataLossError(f"request {call.id} to {call.endpoint!r}: Redis lost its data")
        raise DataLossError(f"request {call.id} to {call.endpoint!r}: its state is gone from Redis "
                            "(expired or lost) while the call was waiting")

    def _withdraw_call(self, call: _Call, state_key: str, mode: str) -> Response | None:
        reply = self._redis(lambda: self._withdraw(keys=[state_key, self.pending_key(call.endpoint)],
                                                   args=self._withdraw_args(call, mode)))
        outcome = _text(reply[0])
        self._step(f"withdraw_{mode}")
        if outcome == "answered":
            return self._decode_response(call.id, reply[1])
        if outcome == "missing":
            self._state_vanished(call)
        if mode == "timeout":
            if outcome == "withdrawn":
                _count(METRIC_PICKUP_TIMEOUTS, call.endpoint)
                raise PickupTimeoutError(
                    f"request {call.id} to {call.endpoint!r}: no polling service took it within the pickup "
                    "timeout; it was taken back from the queue")
            call.taken = True
            return None
        if outcome == "withdrawn":
            when = "before pickup (taken back)"
        else:
            when = "after pickup (the processor was told)"
        raise CancelledError(f"request {call.id} to {call.endpoint!r} cancelled {when}: {call.cancel_reason}")

    # ------------------------------------------------------- processing side

    def dequeue(self, endpoint: str, wait: float | None = None, *,
                track: bool = True) -> PendingRequest | None:
        """The next request for ``endpoint``, waiting up to ``wait`` s (default: the poll wait) for one.

        ``track``: this node claims the request if it is still running after the claim delay,
        heartbeats for it and watches for cancellation until ``apply_response`` (an in-process
        service); the HTTP API passes False: its polling service's response or first heartbeat
        (``processor_heartbeat``) claims it. Raises QueueUnavailableError (Redis unreachable for
        the retry window) or PendingError (Redis refused the pop: a key of the wrong type, OOM).
        """
        self._check_processing(endpoint)
        deadline = time.monotonic() + (self.settings.poll_wait_s if wait is None else wait)
        return self._next(endpoint, deadline, track)

    def _check_processing(self, endpoint: str) -> None:
        check_endpoint(endpoint)
        if self._closed.is_set():
            raise QueueUnavailableError("this node is shutting down")
        if not self._threads:
            raise PendingError("start() the PendingQueue before taking requests")

    def serve(self, endpoint: str, handler: Handler, stop: threading.Event | None = None) -> None:
        """Answer the requests of ``endpoint`` with ``handler`` on this thread until ``stop`` is set
        (seen between polls: within the poll wait) or the node closes (at once). Run it on as many
        threads as requests should run at once. Redis unreachable or refusing is logged and
        retried, never the end of the loop.

        ``handler`` gets each ``PendingRequest`` (its ``cancel`` token fires when the work should
        stop) and returns the response body or a ``Reply`` with streams; an exception it raises,
        or a body JSON cannot hold or the size limit refuses, becomes an error response. Answers go
        through the node's batcher, so a busy node's threads share round trips. (Sending each
        answer in the same write as the thread's next pop was measured slower under load.)
        """
        self._check_processing(endpoint)
        stop = stop or threading.Event()
        while not (stop.is_set() or self._closed.is_set()):
            try:
                request = self._next(endpoint, time.monotonic() + self.settings.poll_wait_s, True)
            except PendingError as exc:  # Redis down for the retry window, or refusing: keep serving
                logger.error("serving %s: %s; polling again", endpoint, exc)
                self._closed.wait(self.settings.retry_interval_s)
                continue
            if request is not None:
                self._answer(request, handler_message(handler, request, self.store))

    def _answer(self, request: PendingRequest, message: dict[str, Any]) -> None:
        """Send a handler's answer; one that cannot be sent is logged and counted, not raised: it
        is that request's problem, not the serving loop's."""
        with self._lock:
            self._tracked.pop(request.id, None)
        try:
            raw = self._encode(message, "response")
        except (ValueError, MessageTooLargeError) as exc:
            logger.error("response to %s on %s replaced by an error: %s", request.id, request.endpoint, exc)
            raw = self._encode({"ok": False, "error": str(exc)}, "response")
        try:
            self._send_response(request.endpoint, request.id, request.take_id, raw)
        except (redis.RedisError, PendingError) as exc:
            _count(METRIC_UNDELIVERED, request.endpoint)
            logger.error("could not store the response to %s on %s: %s", request.id, request.endpoint, exc)

    def _next(self, endpoint: str, deadline: float, track: bool) -> PendingRequest | None:
        subscribed = self._cancel_channels.get(endpoint)
        if subscribed is None:
            with self._lock:
                subscribed = self._cancel_channels.get(endpoint)
                if subscribed is None:
                    subscribed = self._cancel_channels[endpoint] = threading.Event()
                    self._subscriber.subscribe(self.endpoint_channel(endpoint))
        if not subscribed.is_set():  # a first poll: cancellations of what it pops should reach us
            # (no longer than the claim delay: a cancellation is seen at the claim anyway)
            subscribed.wait(max(0.0, min(CLAIM_DELAY_S, deadline - time.monotonic())))
        while not self._closed.is_set():
            take_id = self._new_id()
            element = self._pop(endpoint, take_id, deadline)
            if element is None:
                return None
            request = self._request(endpoint, take_id, element)
            if request is None:
                continue  # unreadable: answered with an error (or dropped); take the next
            self._step("taken")
            if track:
                self._track(request)
            return request
        return None

    def _pop(self, endpoint: str, take_id: str, deadline: float) -> bytes | None:
        """Move the next request of ``endpoint`` into the take key (blocking until ``deadline``).

        BLMOVE and the take key's PEXPIRE go in one write: Redis runs the PEXPIRE right after the
        move, so the moved request is never in a key without a TTL. Retried here for the retry
        window, not by redis-py: after a lost connection the take key is read first, since a pop
        whose reply was lost may have moved a request into it.
        """
        s = self.settings
        tag = self.key_tag(endpoint)
        pending, take = f"{tag}:pending", f"{tag}:t:{take_id}"
        ttl = self._take_ttl_ms
        give_up: float | None = None
        lost = False
        while True:
            connection = self._poll_connection()
            try:
                if self._closed.is_set():
                    return None
                if lost:
                    connection.send_packed_command(connection.pack_commands(
                        [("LINDEX", take, -1), ("PEXPIRE", take, ttl)]))
                    held = self._read_pop(connection, endpoint)
                    if held is not None:
                        return held
                    lost = False
                wait = min(deadline - time.monotonic(), self._pop_block_s)
                pop: tuple[Any, ...] = ("LMOVE", pending, take, "LEFT", "RIGHT")
                if wait > 0:
                    pop = ("BLMOVE", pending, take, "LEFT", "RIGHT", f"{wait:.3f}")
                # (a connection idle past its health-check interval is pinged, and replaced if stale)
                connection.send_packed_command(connection.pack_commands([pop, ("PEXPIRE", take, ttl)]))
                element = self._read_pop(connection, endpoint)
                if element is not None or deadline - time.monotonic() <= 0:
                    return element
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                connection.disconnect()
                if self._closed.is_set():  # close() interrupted the pop: it may have moved one
                    self._give_back_popped(pending, take)
                    return None
                now = time.monotonic()
                give_up = give_up or now + s.retry_window_s
                if now >= give_up:
                    raise QueueUnavailableError(f"Redis unreachable after retrying: {exc}") from exc
                lost = True
                self._closed.wait(s.retry_interval_s)

    @staticmethod
    def _read_pop(connection: Any, endpoint: str) -> bytes | None:
        """The replies of a pop and its PEXPIRE: both are read even if the first is an error
        (WRONGTYPE, OOM...), so the connection's next read gets its own reply."""
        replies = []
        for _ in range(2):
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise PendingError(f"Redis refused the pop on {endpoint!r}: {reply}") from reply
        return replies[0]

    def _give_back_popped(self, pending: str, take: str) -> None:
        """Return what an interrupted pop moved into ``take`` to the head of ``pending``."""
        try:
            if self._give_back(keys=[pending, take], args=[_ms(self.settings.pending_list_ttl_s)]):
                logger.info("closing: gave a popped request back to %s", pending)
        except redis.RedisError:  # Redis unreachable too: the caller's beat finds it popped
            logger.warning("closing: could not give back what a pop may have moved to %s", take)

    def _poll_connection(self) -> Any:
        """This thread's connection for blocking pops (made at its first pop; closed when the
        thread ends and its thread-local goes, or when a pop fails)."""
        connection = getattr(self._poller, "connection", None)
        if connection is None:
            connection_class, kwargs = self._poll_connection_args
            connection = self._poller.connection = connection_class(**kwargs)
            with self._lock:
                self._poll_connections.add(connection)
        return connection

    def _request(self, endpoint: str, take_id: str, element: bytes) -> PendingRequest | None:
        """The popped request; None if it is unreadable (answered with an error, or dropped)."""
        header, _, raw = element.partition(b"\n")
        try:
            request_id, enqueued_at, caller = header.decode().split(" ", 2)
            enqueued = int(enqueued_at)
        except ValueError:  # not written by enqueue.lua: no id to answer; its take key expires
            _count(METRIC_DROPPED, endpoint)
            logger.error("dropped an unreadable element of %s's pending list: %r", endpoint, element[:200])
            return None
        try:
            message = json.loads(raw)
            streams = [StreamRef.from_json(r) for r in message.get("streams") or []]
            body = message.get("body")
        except (ValueError, TypeError, AttributeError, PendingError) as exc:
            logger.error("unreadable request %s on %s, answered with an error: %s", request_id, endpoint, exc)
            self.respond(endpoint, request_id, take_id, {"ok": False, "error": f"unreadable request: {exc}"})
            return None
        return PendingRequest(request_id, endpoint, take_id, body, streams, caller, enqueued)

    def _track(self, request: PendingRequest) -> None:
        with self._lock:
            self._tracked[request.id] = _Tracked(
                request, time.monotonic() + min(CLAIM_DELAY_S, self.settings.heartbeat_initial_delay_s))

    def apply_response(
        self,
        request: PendingRequest,
        body: Any = None,
        *,
        error: str | None = None,
        streams: Mapping[str, bytes | BinaryIO] | None = None,
    ) -> Delivery:
        """Answer a dequeued request (``error``: the service failed). Returns what became of it."""
        with self._lock:
            self._tracked.pop(request.id, None)
        if error is not None:
            message: dict[str, Any] = {"ok": False, "error": str(error)}
        else:
            refs = self._store_streams(streams)
            message = {"ok": True, "body": body, "streams": [r.to_json() for r in refs]}
        return self.respond(request.endpoint, request.id, request.take_id, message)

    def respond(self, endpoint: str, request_id: str, take_id: str, message: dict[str, Any]) -> Delivery:
        """Store a response message for a taken request and tell its caller (respond.lua)."""
        return self._send_response(endpoint, request_id, take_id, self._encode(message, "response"))

    def _send_response(self, endpoint: str, request_id: str, take_id: str, raw: bytes) -> Delivery:
        s = self.settings
        tag = self.key_tag(endpoint)
        outcome = Delivery(_text(self._redis(lambda: self._batch.call(
            self._respond, [f"{tag}:r:{request_id}", f"{tag}:t:{take_id}"],
            [take_id, raw, _ms(s.response_ttl_s), self.node_channel_prefix, _ms(s.sender_timeout_s),
             request_id, self.node_id]))))
        self._step("responded")
        if outcome is not Delivery.DELIVERED:
            _count(METRIC_UNDELIVERED, endpoint)
            logger.info("response to %s on %s not delivered: %s", request_id, endpoint, outcome.value)
        return outcome

    def processor_heartbeat(self, endpoint: str, request_id: str, take_id: str) -> ProcessorBeat:
        """The processor is alive (the first beat also claims the request); learn whether its work
        should stop (cancelled, caller gone, lost)."""
        s = self.settings
        tag = self.key_tag(endpoint)
        reply = self._redis(lambda: self._heartbeat(
            keys=[f"{tag}:r:{request_id}", f"{tag}:t:{take_id}"],
            args=["p", take_id, _ms(s.in_flight_ttl_s), request_id, self.node_id]))
        state = _text(reply[0])
        if state == "missing":
            if self.check_data_loss():
                return ProcessorBeat(True, "Redis lost its data")
            return ProcessorBeat(True, "the request is gone from Redis (expired)")
        if state == "not_taker":
            return ProcessorBeat(True, "this take no longer holds the request")
        if int(reply[2]):
            return ProcessorBeat(True, "the caller cancelled the request")
        if int(reply[1]) > _ms(s.sender_timeout_s):
            return ProcessorBeat(True, f"the caller sent no heartbeat for {int(reply[1]) / 1000:.0f} s "
                                       f"(limit {s.sender_timeout_s:g} s); it is presumed gone")
        return ProcessorBeat(False)

    # ------------------------------------------------------------ data loss

    def _check_guard(self) -> bool:
        """Swap the guard in (SET ... GET, one command); True when it had vanished (Redis lost data).

        A guard last set longer ago than its TTL may simply have expired (a Lambda environment
        frozen for hours): that re-arms it and is no loss. Wall-clock time, which runs while frozen.
        """
        ttl_ms = _ms(self.settings.data_loss_guard_ttl_s)
        previous = self.client.set(self._guard_key, self._guard_token, px=ttl_ms, get=True)
        now = time.time()
        last = self._guard_set_at
        armed = last is not None and now - last < self.settings.data_loss_guard_ttl_s
        self._guard_set_at = now
        return armed and previous != self._guard_token.encode()

    def check_data_loss(self) -> bool:
        """Check the guard now; on loss every in-flight call fails and every taken request is cancelled."""
        try:
            lost = self._redis(self._check_guard)
        except QueueUnavailableError:
            return False
        if lost:
            self._on_data_loss()
        return lost

    def _on_data_loss(self) -> None:
        self.data_loss_events += 1
        _count(METRIC_DATA_LOSS)
        logger.error("Redis lost its data (guard %s vanished): failing in-flight requests", self._guard_key)
        with self._lock:
            calls, tracked = list(self._calls.values()), list(self._tracked.values())
            self._tracked.clear()
        for call in calls:
            call.error = DataLossError(f"request {call.id} to {call.endpoint!r}: Redis lost its data "
                                       "while the request was in flight")
            call.event.set()
        for item in tracked:
            item.request.cancel.cancel("Redis lost its data")

    # ------------------------------------------------------ background work

    def _watch(self) -> None:
        """Data-loss checks and the heartbeats of tracked (in-process) requests."""
        s = self.settings
        next_guard = time.monotonic() + s.data_loss_check_s
        while not self._closed.wait(min(1.0, s.heartbeat_interval_s / 4, s.data_loss_check_s)):
            now = time.monotonic()
            if now >= next_guard:
                next_guard = now + s.data_loss_check_s
                try:
                    self.check_data_loss()
                except redis.RedisError as exc:  # refused (OOM...): the next check tries again
                    logger.warning("data-loss check failed: %s", exc)
            with self._lock:
                due = [t for t in self._tracked.values() if t.next_beat <= now]
            for item in due:
                item.next_beat = now + s.heartbeat_interval_s
                request = item.request
                try:
                    beat = self.processor_heartbeat(request.endpoint, request.id, request.take_id)
                except (QueueUnavailableError, redis.RedisError) as exc:  # the next beat tries again
                    logger.warning("heartbeat for %s failed: %s", request.id, exc)
                    continue
                if beat.cancelled:
                    with self._lock:
                        self._tracked.pop(request.id, None)
                    request.cancel.cancel(beat.reason or "cancelled")

    def _on_subscriber_lost(self) -> None:
        """The pub/sub connection is gone: nothing is subscribed until the listener reconnects."""
        self._node_ready.clear()

    def _on_message(self, message: dict[str, Any]) -> None:
        kind, data = message["type"], message["data"]
        if kind == "subscribe":
            # First subscription, or a re-subscription after a reconnect: messages may have been
            # missed meanwhile, so every waiting caller checks Redis again. (A missed cancellation
            # reaches a processor at its next heartbeat.)
            channel = _text(message["channel"])
            if channel == self.node_channel:
                self._node_ready.set()
                with self._lock:
                    calls = list(self._calls.values())
                for call in calls:
                    call.recheck = True
                    call.event.set()
            else:
                subscribed = self._cancel_channels.get(channel.removeprefix(f"{self.settings.prefix}:ep:"))
                if subscribed is not None:
                    subscribed.set()
            return
        if kind != "message":
            return
        request_id = data[1:1 + ID_LENGTH].decode()
        if data[:1] == RESPONSE_MESSAGE:
            call = self._calls.get(request_id)
            if call is not None:
                call.response = data[2 + ID_LENGTH:]
                call.event.set()
        elif data[:1] == CANCEL_MESSAGE:  # on the node channel, or an endpoint's (unclaimed)
            with self._lock:
                item = self._tracked.pop(request_id, None)
            if item is not None:
                item.request.cancel.cancel("the caller cancelled the request")

    # ---------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        """Queue depth, in-flight requests by state and oldest age, per endpoint (SCAN: an admin view)."""
        now_ms = int(self._redis(self.client.time)[0]) * 1000
        prefix = f"{self.settings.prefix}:{{"
        endpoints: dict[str, dict[str, Any]] = {}

        def entry(endpoint: str) -> dict[str, Any]:
            return endpoints.setdefault(endpoint, {"waiting": 0, "queued": 0, "taken": 0, "answered": 0,
                                                   "oldest_age_s": 0.0})

        for key in self._redis(lambda: list(self.client.scan_iter(match=f"{prefix}*}}:r:*", count=1000))):
            text = _text(key)
            endpoint = text[len(prefix):text.rindex("}:r:")]
            state, at = self.client.hmget(key, "s", "at")
            if state is None:
                continue
            item = entry(endpoint)
            item[{"q": "queued", "t": "taken", "a": "answered"}[_text(state)]] += 1
            item["oldest_age_s"] = max(item["oldest_age_s"], (now_ms - int(at)) / 1000)
        for key in self._redis(lambda: list(self.client.scan_iter(match=f"{prefix}*}}:pending", count=1000))):
            text = _text(key)
            entry(text[len(prefix):text.rindex("}:pending")])["waiting"] = self.client.llen(key)
        return dict(sorted(endpoints.items()))
