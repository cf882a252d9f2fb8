"""What the pending queue's sides exchange: requests, responses, their wire messages, cancel tokens.

Shared by the caller's side (``caller.py``), the processing side (``processor.py``), the HTTP
node API (``api.py``) and the Python polling-service client (``client.py``).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, BinaryIO

from switchyard.core import tracing
from switchyard.pending.errors import MessageTooLargeError, PendingError, RemoteError
from switchyard.pending.settings import PENDING
from switchyard.pending.streams import StreamRef, StreamStore

logger = logging.getLogger(__name__)

ID_LENGTH = 32  # request ids are fixed-length, so node-channel messages need no parsing
RESPONSE_MESSAGE = b"r"  # node channel: b"r" + id + b"\n" + response JSON
CANCEL_MESSAGE = b"c"  # node channel, or endpoint channel while unclaimed: b"c" + id


class Delivery(StrEnum):
    """What ``apply_response`` did (the values respond.lua returns)."""

    DELIVERED = "delivered"
    CANCELLED = "cancelled"  # the caller cancelled: the response was dropped
    ABANDONED = "abandoned"  # the caller stopped heartbeating: the response was dropped
    GONE = "gone"  # no such request in Redis (data loss, or it expired)
    NOT_TAKER = "not_taker"  # this take no longer holds the request


class CancelToken:
    """A cancellation signal with a reason; callbacks run once, on the cancelling thread. (Its Event
    is made by the first ``wait``: every taken request has a token, few are waited on.)"""

    def __init__(self) -> None:
        self._event: threading.Event | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[str], None]] = []
        self.reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            event = self._event
            callbacks, self._callbacks = self._callbacks, []
        if event is not None:
            event.set()
        for callback in callbacks:
            callback(reason)

    def cancel_after(self, seconds: float, reason: str = "timed out") -> threading.Timer:
        """Cancel in ``seconds`` unless cancelled before (a call deadline)."""
        timer = threading.Timer(seconds, self.cancel, args=(f"{reason} after {seconds:g} s",))
        timer.daemon = True
        timer.start()
        return timer

    def is_cancelled(self) -> bool:
        return self.reason is not None

    def wait(self, timeout: float | None = None) -> bool:
        with self._lock:
            if self.reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def on_cancel(self, callback: Callable[[str], None]) -> None:
        with self._lock:
            if self.reason is None:
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
    traceparent: str | None = None  # the caller's, as it queued the request (None: it sent none)

    def to_json(self) -> dict[str, Any]:
        """What the HTTP long poll hands a polling service."""
        return {"id": self.id, "take": self.take_id, "body": self.body,
                "streams": [s.to_json() for s in self.streams], "enqueued_at_ms": self.enqueued_at_ms,
                "traceparent": self.traceparent}


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


def store_streams(stream_store: StreamStore | None,
                  streams: Mapping[str, bytes | BinaryIO] | None) -> list[StreamRef]:
    """Put ``streams`` in ``stream_store``; their references (messages carry references, never bytes)."""
    if not streams:
        return []
    if stream_store is None:
        raise PendingError(f"streams need a store: set {PENDING['store'].name}")
    return [stream_store.put(name, data) for name, data in streams.items()]


def handler_message(handler: Callable[[Any], Any], request: Any,
                    stream_store: StreamStore | None) -> dict[str, Any]:
    """Run a service's handler under the request's trace (its ``traceparent``: the logger's
    correlation id); the response message for its answer (streams stored), or for its failure (any
    exception: it is this request's problem only)."""
    context = tracing.continue_from(request.traceparent)
    started = time.perf_counter()
    with tracing.scope(context):
        try:
            result = handler(request)
            if not isinstance(result, Reply):
                result = Reply(result)
            streams = [ref.to_json() for ref in store_streams(stream_store, result.streams)]
            message = {"ok": True, "body": result.body, "streams": streams}
        except Exception as exc:
            logger.exception("handler failed for request %s", request.id)
            message = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    tracing.hop(context, "pending", "handled", duration_ms=(time.perf_counter() - started) * 1000,
                id=request.id, status="ok" if message["ok"] else "error")
    return message


@dataclass(frozen=True)
class ProcessorBeat:
    """What a processor's heartbeat learned: whether to stop working on the request, and why."""

    cancelled: bool
    reason: str | None = None


class IdSource:
    """Request and take ids: a random prefix of this process + a counter (32 hex digits, as a
    uuid4's): unique without a system call per id (uuid4's urandom was 7% of a busy service
    node's CPU). Random, not the node id: a node restarted with the same id starts afresh."""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:20]
        self._counter = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter):012x}"  # next() on a count is atomic


_COMPACT = json.JSONEncoder(separators=(",", ":"))  # made once: json.dumps makes one per call with them


def encode_message(message: dict[str, Any], what: str, limit: int) -> bytes:
    """A request or response message as sent: compact JSON, at most ``limit`` bytes."""
    try:
        raw = _COMPACT.encode(message).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} body is not JSON-serialisable: {exc}") from exc
    if len(raw) > limit:
        raise MessageTooLargeError(
            f"{what} is {len(raw)} bytes, over {PENDING['max_message_bytes'].name}={limit}; "
            "send large data as streams")
    return raw


def decode_response(request_id: str, raw: bytes) -> Response:
    """The response a caller gets; RemoteError when the service failed."""
    try:
        message = json.loads(raw)
        ok = bool(message["ok"])
    except (ValueError, KeyError, TypeError) as exc:
        raise PendingError(f"request {request_id}: unreadable response {raw[:200]!r}") from exc
    if not ok:
        raise RemoteError(f"request {request_id}: the service failed", str(message.get("error")).encode())
    return Response(message.get("body"), [StreamRef.from_json(s) for s in message.get("streams") or []])
