"""The caller's side of a node: ``queue_and_wait`` sends a request and waits for its response.

A call enqueues its request (one script) and, in the same write, waits for the response in a
blocking pop on its own answer list, until the first heartbeat is due: the raw lists' way, one
round trip from the enqueue to the response (when a waiting connection is free, else as below).
A call still unanswered then (or a call beyond the waiting connections) waits on the node's
pub/sub connection (``subscriber.py``: the waiting thread reads it itself when no other thread
does, so a call crosses no thread hand-off); its first beat moves the response to the node
channel. A cancel or a failure of the node ends an answer-list wait at once. Nothing periodic happens before
``heartbeat_initial_delay_s`` (the fast-RPC shortcut); after it, the caller's heartbeat (one
command) is also its pickup check and its response poll, so a lost pub/sub message costs latency,
never a call. The pickup timeout withdraws a request nobody took; a cancel token withdraws it or
tells its processor. An answered state is unlinked off the caller's path, by the reaper
(``watcher.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from switchyard.core import tracing
from switchyard.pending import metrics
from switchyard.pending.errors import (
    CancelledError,
    DataLossError,
    PendingError,
    PickupTimeoutError,
    ProcessorLostError,
)
from switchyard.pending.model import CancelToken, Response, decode_response, encode_message, store_streams
from switchyard.pending.ports import NodeContext, RequestState, WaitOutcome, WithdrawOutcome
from switchyard.pending.settings import check_endpoint
from switchyard.pending.streams import StreamRef, StreamStore
from switchyard.pending.wakeup import Signal

logger = logging.getLogger(__name__)


@dataclass
class Call:
    """One call in flight, as its waiting thread and the node's message dispatch see it."""

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


class Caller:
    """The calls of one node: sending, waiting, heartbeats, pickup timeout, cancellation."""

    def __init__(self, node: NodeContext, streams: StreamStore | None,
                 collect: Callable[[str, str], None]) -> None:
        self.settings = node.settings
        self.streams = streams
        self._node = node
        self._collect_later = collect  # (endpoint, request id): unlink its answered state, batched
        self._lock = threading.Lock()
        self._calls: dict[str, Call] = {}

    # ------------------------------------------------------ what the node tells

    def deliver(self, request_id: str, raw: bytes) -> None:
        """A response message arrived on the node channel (on the thread reading it)."""
        call = self._calls.get(request_id)
        if call is not None:
            call.response = raw
            call.event.set()

    def recheck_all(self) -> None:
        """Messages may have been missed (a re-subscription): every waiting call checks Redis."""
        with self._lock:
            calls = list(self._calls.values())
        for call in calls:
            call.recheck = True
            call.event.set()  # (a call in an answer-list wait reads no node channel: nothing missed)

    def fail_all(self, error: Callable[[Call], PendingError], *, keep_first: bool = False,
                 only: Callable[[str], bool] | None = None) -> None:
        """End every call in flight (``only``: to the endpoints it accepts) with ``error(call)``
        (``keep_first``: unless it has one already)."""
        with self._lock:
            calls = [c for c in self._calls.values() if only is None or only(c.endpoint)]
        for call in calls:
            call.error = (call.error if keep_first else None) or error(call)
            call.event.set()
            self._node.store.interrupt_wait(call.id)

    # ------------------------------------------------------------- calling

    def queue_and_wait(self, endpoint: str, body: Any, streams: Mapping[str, bytes | BinaryIO] | None,
                       pickup_timeout: float | None, cancel: CancelToken | None) -> Response:
        """Send ``body`` (JSON) to the polling service of ``endpoint``; block until it answers
        (``PendingQueue.queue_and_wait`` says what it raises)."""
        check_endpoint(endpoint)
        s = self.settings
        refs = store_streams(self.streams, streams)
        try:
            trace = tracing.outgoing()  # the request in hand's trace, else a new one
            message = encode_message({"body": body, "streams": [r.to_json() for r in refs],
                                      "traceparent": trace.traceparent}, "request", s.max_message_bytes)
            tracing.hop(trace, "pending", "queued", endpoint=endpoint)
            return self._call(endpoint, message, pickup_timeout or s.pickup_timeout_s, cancel)
        finally:
            for ref in refs:
                self._delete_stream(ref)

    def _delete_stream(self, ref: StreamRef) -> None:
        try:
            self.streams.delete(ref)  # type: ignore[union-attr]
        except Exception:  # a leftover stream is the store's lifecycle rule's to expire
            logger.warning("could not delete stream %s", ref.id, exc_info=True)

    def _call(self, endpoint: str, message: bytes, pickup_timeout: float,
              cancel: CancelToken | None) -> Response:
        s = self.settings
        request_id = self._node.new_id()
        node_id = self._node.store.node_id.encode()
        element = b"%s %d %s\n%s" % (request_id.encode(), time.time() * 1000, node_id, message)
        call = Call(request_id, endpoint, element)
        with self._lock:
            self._calls[call.id] = call

        def on_cancel(reason: str) -> None:
            call.cancel_reason = reason
            call.event.set()
            self._node.store.interrupt_wait(call.id)

        if cancel is not None:
            cancel.on_cancel(on_cancel)
        try:
            self._node.step("before_enqueue")
            started = time.monotonic()
            pickup_deadline: float | None = started + pickup_timeout
            next_beat = started + s.heartbeat_initial_delay_s
            first_wait = min(s.heartbeat_initial_delay_s, pickup_timeout)
            store = self._node.store
            waited = store.enqueue_and_wait(endpoint, request_id, element, pickup_timeout, first_wait,
                                            call.ready, lambda: self._node.step("enqueued"))
            if waited.outcome is WaitOutcome.ANSWERED:
                return self._collect(call, waited.response or b"")
            if waited.outcome is WaitOutcome.BROKEN:
                next_beat = time.monotonic()  # the response may be on the answer list: the beat tells
            while True:
                wake_at = min(next_beat, pickup_deadline or next_beat)
                self._node.subscriber.wait(call.event, max(0.0, wake_at - time.monotonic()), call.ready)
                if call.response is not None:
                    return self._collect(call, call.response)
                if call.error is not None:
                    raise call.error
                if call.cancel_reason is not None:
                    return self._withdraw(call, "cancel")  # type: ignore[return-value]  # a response, or raises
                now = time.monotonic()
                if pickup_deadline is not None and now >= pickup_deadline:
                    pickup_deadline = None
                    answer = self._withdraw(call, "timeout")
                    if answer is not None:
                        return answer
                if call.recheck or now >= next_beat:
                    call.recheck = False
                    next_beat = now + s.heartbeat_interval_s
                    answer = self._beat(call)
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

    def _collect(self, call: Call, raw: bytes) -> Response:
        """The call has its response: the answered state is unlinked off the caller's path (the
        reaper batches them); if this process dies first, the state's response TTL removes it."""
        self._node.step("before_collect")
        self._collect_later(call.endpoint, call.id)
        self._node.step("collected")
        return decode_response(call.id, raw)

    def _beat(self, call: Call) -> Response | None:
        """Heartbeat + pickup check + response poll, one command; raises when the call is lost."""
        s = self.settings
        reply = self._node.store.caller_beat(call.endpoint, call.id, call.element)
        if reply.state is RequestState.MISSING:
            self._state_vanished(call)
        if reply.state is RequestState.ANSWERED:
            return self._collect(call, reply.response)
        if reply.state is RequestState.TAKEN:
            call.taken = True
        if reply.state is RequestState.REQUEUED:
            # Popped and never claimed for the processor timeout: the node that popped it died
            # before handing it over (SIGKILL mid long poll), so it was put back for another.
            logger.warning("request %s to %r: popped and never claimed for %g s; back in the queue",
                           call.id, call.endpoint, s.processor_timeout_s)
            metrics.count(metrics.PENDING_REQUESTS_REQUEUED, call.endpoint)
            call.requeued = True
        # Taken: ms since the processor's last beat.
        if reply.processor_silence_ms > max(1, int(s.processor_timeout_s * 1000)):
            self._node.store.withdraw(call.endpoint, call.id, call.element, "cancel")
            metrics.count(metrics.PENDING_PROCESSORS_LOST, call.endpoint)
            raise ProcessorLostError(
                f"request {call.id} to {call.endpoint!r}: the node processing it sent no heartbeat for "
                f"{reply.processor_silence_ms / 1000:.0f} s (limit {s.processor_timeout_s:g} s); "
                "presumed offline")
        return None

    def _state_vanished(self, call: Call) -> None:
        if self._node.check_data_loss():
            raise DataLossError(f"request {call.id} to {call.endpoint!r}: Redis lost its data")
        raise DataLossError(f"request {call.id} to {call.endpoint!r}: its state is gone from Redis "
                            "(expired or lost) while the call was waiting")

    def _withdraw(self, call: Call, mode: str) -> Response | None:
        reply = self._node.store.withdraw(call.endpoint, call.id, call.element, mode)
        self._node.step(f"withdraw_{mode}")
        if reply.outcome is WithdrawOutcome.ANSWERED:
            return decode_response(call.id, reply.response or b"")
        if reply.outcome is WithdrawOutcome.MISSING:
            self._state_vanished(call)
        if mode == "timeout":
            if reply.outcome is WithdrawOutcome.WITHDRAWN:
                metrics.count(metrics.PENDING_PICKUP_TIMEOUTS, call.endpoint)
                raise PickupTimeoutError(
                    f"request {call.id} to {call.endpoint!r}: no polling service took it within the pickup "
                    "timeout; it was taken back from the queue")
            call.taken = True
            return None
        if reply.outcome is WithdrawOutcome.WITHDRAWN:
            when = "before pickup (taken back)"
        else:
            when = "after pickup (the processor was told)"
        raise CancelledError(f"request {call.id} to {call.endpoint!r} cancelled {when}: {call.cancel_reason}")
