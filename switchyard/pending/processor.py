"""The processing side of a node: what it does for the polling services connected to it.

``dequeue`` takes the next request of an endpoint (a blocking pop that moves the whole request
into a take key of this poller: Redis wakes one poller per request, with no pulse and no read);
``apply_response``/``respond`` answer it (one script that also claims it if nobody did yet);
``processor_heartbeat`` says the service is alive and learns whether its work should stop. The
claim is lazy: a request answered within ``CLAIM_DELAY_S`` is claimed by its response, one still
running by the first heartbeat. ``serve`` runs an in-process handler in a loop; the HTTP node API
(``api.py``) calls the same operations for remote polling services.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, BinaryIO

from switchyard.pending import metrics
from switchyard.pending.errors import MessageTooLargeError, PendingError, StoreUnavailableError
from switchyard.pending.model import (
    Delivery,
    Handler,
    PendingRequest,
    ProcessorBeat,
    encode_message,
    handler_message,
    store_streams,
)
from switchyard.pending.ports import Answer, NodeContext, ProcessorState
from switchyard.pending.settings import check_endpoint
from switchyard.pending.streams import StreamRef, StreamStore

logger = logging.getLogger(__name__)

# A popped request still running this long after the pop is claimed by its processor's first
# heartbeat (capped by ``heartbeat_initial_delay_s``); one answered sooner, by its response.
CLAIM_DELAY_S = 1.0


@dataclass
class Tracked:
    """A request processed in this process: its node heartbeats for it until it is answered."""

    request: PendingRequest
    next_beat: float


class Processor:
    """The requests this node takes for its polling services, and their answers."""

    def __init__(self, node: NodeContext, streams: StreamStore | None, closed: threading.Event,
                 started: Callable[[], bool]) -> None:
        self.settings = node.settings
        self.streams = streams
        self._node = node
        self._closed = closed
        self._started = started
        self._lock = threading.Lock()
        self._tracked: dict[str, Tracked] = {}
        self._cancel_channels: dict[str, threading.Event] = {}  # endpoint channel -> subscribed

    # ------------------------------------------------------ what the node tells

    def channel_subscribed(self, channel: str) -> None:
        """An endpoint channel's subscription is confirmed: cancellations on it reach this node."""
        subscribed = self._cancel_channels.get(channel)
        if subscribed is not None:
            subscribed.set()

    def cancel(self, request_id: str, reason: str) -> None:
        """Stop tracking a request and fire its cancel token (its work should stop)."""
        with self._lock:
            item = self._tracked.pop(request_id, None)
        if item is not None:
            item.request.cancel.cancel(reason)

    def cancel_all(self, reason: str, only: Callable[[str], bool] | None = None) -> None:
        """Cancel every tracked request (``only``: of the endpoints it accepts): data loss, or the
        node closes."""
        with self._lock:
            tracked = [t for t in self._tracked.values() if only is None or only(t.request.endpoint)]
            for item in tracked:
                self._tracked.pop(item.request.id, None)
        for item in tracked:
            item.request.cancel.cancel(reason)

    def beat_due(self) -> None:
        """Heartbeat the tracked requests whose beat is due; cancel those that should stop."""
        now = time.monotonic()
        with self._lock:
            due = [t for t in self._tracked.values() if t.next_beat <= now]
        for item in due:
            item.next_beat = now + self.settings.heartbeat_interval_s
            request = item.request
            try:
                beat = self.processor_heartbeat(request.endpoint, request.id, request.take_id)
            except PendingError as exc:  # unreachable or refused: the next beat tries again
                logger.warning("heartbeat for %s failed: %s", request.id, exc)
                continue
            if beat.cancelled:
                with self._lock:
                    self._tracked.pop(request.id, None)
                request.cancel.cancel(beat.reason or "cancelled")

    # ------------------------------------------------------------- taking

    def dequeue(self, endpoint: str, wait: float | None, track: bool) -> PendingRequest | None:
        """The next request for ``endpoint``, waiting up to ``wait`` s (default: the poll wait)."""
        self._check_processing(endpoint)
        deadline = time.monotonic() + (self.settings.poll_wait_s if wait is None else wait)
        return self._next(endpoint, deadline, track)

    def _check_processing(self, endpoint: str) -> None:
        check_endpoint(endpoint)
        if self._closed.is_set():
            raise StoreUnavailableError("this node is shutting down")
        if not self._started():
            raise PendingError("start() the PendingQueue before taking requests")

    def serve(self, endpoint: str, handler: Handler, stop: threading.Event | None = None) -> None:
        """Answer the requests of ``endpoint`` with ``handler`` on this thread until ``stop`` is set
        or the node closes; Redis unreachable or refusing is logged and retried (see PendingQueue)."""
        self._check_processing(endpoint)
        stop = stop or threading.Event()
        answer: Answer | None = None  # the previous request's response: it goes with the next pop
        while not (stop.is_set() or self._closed.is_set()):
            try:
                request = self._next(endpoint, time.monotonic() + self.settings.poll_wait_s, True, answer)
            except PendingError as exc:  # Redis down for the retry window, or refusing: keep serving
                logger.error("serving %s: %s; polling again", endpoint, exc)
                self._closed.wait(self.settings.retry_interval_s)
                continue
            finally:
                answer = None  # (the store sends it on every path, or tells why it could not)
            if request is not None:
                raw = self._encoded(request, handler_message(handler, request, self.streams))
                answer = Answer(request.id, request.take_id, raw, partial(self._told, request))
                if stop.is_set() or self._closed.is_set():
                    answer = None  # (no next pop: sent alone)
                    self._told(request, partial(self._node.store.respond, request.endpoint, request.id,
                                                request.take_id, raw))

    def _next(self, endpoint: str, deadline: float, track: bool,
              answer: Answer | None = None) -> PendingRequest | None:
        channel = self._node.store.endpoint_channel(endpoint)
        subscribed = self._cancel_channels.get(channel)
        if subscribed is None:
            with self._lock:
                subscribed = self._cancel_channels.get(channel)
                if subscribed is None:
                    subscribed = self._cancel_channels[channel] = threading.Event()
                    self._node.subscriber.subscribe(channel)
        if not subscribed.is_set():  # a first poll: cancellations of what it pops should reach us
            # (no longer than the claim delay: a cancellation is seen at the claim anyway)
            subscribed.wait(max(0.0, min(CLAIM_DELAY_S, deadline - time.monotonic())))
        while not self._closed.is_set() or answer is not None:
            take_id = self._node.new_id()
            element = self._node.store.pop(endpoint, take_id, deadline, answer)
            answer = None
            if element is None:
                return None
            request = self._request(endpoint, take_id, element)
            if request is None:
                continue  # unreadable: answered with an error (or dropped); take the next
            self._node.step("taken")
            if track:
                first_beat = time.monotonic() + min(CLAIM_DELAY_S, self.settings.heartbeat_initial_delay_s)
                with self._lock:
                    self._tracked[request.id] = Tracked(request, first_beat)
            return request
        return None

    def _request(self, endpoint: str, take_id: str, element: bytes) -> PendingRequest | None:
        """The popped request; None if it is unreadable (answered with an error, or dropped)."""
        header, _, raw = element.partition(b"\n")
        try:
            request_id, enqueued_at, caller = header.decode().split(" ", 2)
            enqueued = int(enqueued_at)
        except ValueError:  # not written by enqueue.lua: no id to answer; its take key expires
            metrics.count(metrics.PENDING_REQUESTS_DROPPED, endpoint)
            logger.error("dropped an unreadable element of %s's pending list: %r", endpoint, element[:200])
            return None
        try:
            message = json.loads(raw)
            streams = [StreamRef.from_json(r) for r in message.get("streams") or []]
            body = message.get("body")
            traceparent = message.get("traceparent")
        except (ValueError, TypeError, AttributeError, PendingError) as exc:
            logger.error("unreadable request %s on %s, answered with an error: %s", request_id, endpoint, exc)
            self.respond(endpoint, request_id, take_id, {"ok": False, "error": f"unreadable request: {exc}"})
            return None
        return PendingRequest(request_id, endpoint, take_id, body, streams, caller, enqueued,
                              traceparent=traceparent if isinstance(traceparent, str) else None)

    # ----------------------------------------------------------- answering

    def _encoded(self, request: PendingRequest, message: dict[str, Any]) -> bytes:
        """A handler's answer as a response message (untracked: no more heartbeats for it)."""
        with self._lock:
            self._tracked.pop(request.id, None)
        limit = self.settings.max_message_bytes
        try:
            return encode_message(message, "response", limit)
        except (ValueError, MessageTooLargeError) as exc:
            logger.error("response to %s on %s replaced by an error: %s", request.id, request.endpoint, exc)
            return encode_message({"ok": False, "error": str(exc)}, "response", limit)

    def _told(self, request: PendingRequest, outcome: Callable[[], str]) -> None:
        """What became of a handler's answer (``outcome`` raises if it could not be stored): one
        that could not is logged and counted, not raised: it is that request's problem, not the
        serving loop's."""
        try:
            self._delivered(request.endpoint, request.id, Delivery(outcome()))
        except PendingError as exc:
            metrics.count(metrics.PENDING_RESPONSES_UNDELIVERED, request.endpoint)
            logger.error("could not store the response to %s on %s: %s", request.id, request.endpoint, exc)

    def apply_response(self, request: PendingRequest, body: Any, error: str | None,
                       streams: Mapping[str, bytes | BinaryIO] | None) -> Delivery:
        """Answer a dequeued request (``error``: the service failed). Returns what became of it."""
        with self._lock:
            self._tracked.pop(request.id, None)
        if error is not None:
            message: dict[str, Any] = {"ok": False, "error": str(error)}
        else:
            refs = store_streams(self.streams, streams)
            message = {"ok": True, "body": body, "streams": [r.to_json() for r in refs]}
        return self.respond(request.endpoint, request.id, request.take_id, message)

    def respond(self, endpoint: str, request_id: str, take_id: str, message: dict[str, Any]) -> Delivery:
        """Store a response message for a taken request and tell its caller (respond.lua)."""
        raw = encode_message(message, "response", self.settings.max_message_bytes)
        return self._send_response(endpoint, request_id, take_id, raw)

    def _send_response(self, endpoint: str, request_id: str, take_id: str, raw: bytes) -> Delivery:
        return self._delivered(endpoint, request_id, Delivery(self._node.store.respond(endpoint, request_id,
                                                                                        take_id, raw)))

    def _delivered(self, endpoint: str, request_id: str, outcome: Delivery) -> Delivery:
        self._node.step("responded")
        if outcome is not Delivery.DELIVERED:
            metrics.count(metrics.PENDING_RESPONSES_UNDELIVERED, endpoint)
            logger.info("response to %s on %s not delivered: %s", request_id, endpoint, outcome.value)
        return outcome

    def processor_heartbeat(self, endpoint: str, request_id: str, take_id: str) -> ProcessorBeat:
        """The processor is alive (the first beat also claims the request); learn whether its work
        should stop (cancelled, caller gone, lost)."""
        s = self.settings
        reply = self._node.store.processor_beat(endpoint, request_id, take_id)
        if reply.state is ProcessorState.MISSING:
            if self._node.check_data_loss():
                return ProcessorBeat(True, "Redis lost its data")
            return ProcessorBeat(True, "the request is gone from Redis (expired)")
        if reply.state is ProcessorState.NOT_TAKER:
            return ProcessorBeat(True, "this take no longer holds the request")
        if reply.cancelled:
            return ProcessorBeat(True, "the caller cancelled the request")
        silence_ms = reply.caller_silence_ms
        if silence_ms > max(1, int(s.sender_timeout_s * 1000)):
            return ProcessorBeat(True, f"the caller sent no heartbeat for {silence_ms / 1000:.0f} s "
                                       f"(limit {s.sender_timeout_s:g} s); it is presumed gone")
        return ProcessorBeat(False)
