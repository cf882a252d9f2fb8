"""Composition: ``PendingQueue``, one node of the pending request queue, made once per process by
``build_service(settings)`` from settings its caller has read (the shape every part has; the
adapters call it: the CLI, ``functions/pending_api.py`` through ``switchyard.aws.services``).

A caller anywhere runs ``queue_and_wait(endpoint, ...)``; the node a polling service is connected
to runs ``dequeue(endpoint)`` for it and, once the service answered, ``apply_response(...)``. The
node wires its sides from settings: the Redis store (``store.py``, behind ``ports.py``), the
caller's side (``caller.py``), the processing side (``processor.py``) and the housekeeping
(``watcher.py``: data-loss watch, heartbeats of tracked requests, reaper), and routes what its one
pub/sub connection brings (responses and cancellations on the node channel, cancellations of
unclaimed requests on each polled endpoint's channel). See docs/pending.md and the Lua scripts in
``lua/`` for the key layout and each step.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from switchyard.pending.caller import Caller
from switchyard.pending.errors import DataLossError, PendingError, StoreUnavailableError
from switchyard.pending.model import (
    CANCEL_MESSAGE,
    ID_LENGTH,
    RESPONSE_MESSAGE,
    CancelToken,
    Delivery,
    Handler,
    IdSource,
    PendingRequest,
    ProcessorBeat,
    Response,
)
from switchyard.pending.ports import NodeContext
from switchyard.pending.processor import Processor
from switchyard.pending.settings import PendingSettings
from switchyard.pending.store import RedisStore
from switchyard.pending.streams import StreamStore, store_from_uri
from switchyard.pending.watcher import Reaper, Watcher

if TYPE_CHECKING:
    from switchyard.core.redis_client import RedisClient


class PendingQueue:
    """One node of the pending request queue (caller side and processing side)."""

    def __init__(
        self,
        settings: PendingSettings | None = None,
        *,
        client: RedisClient | None = None,
        store: StreamStore | None = None,
        node_id: str | None = None,
        on_step: Callable[[str], None] | None = None,
    ) -> None:
        """``client``: the Redis client (default: from settings); ``store``: where streams go
        (default: ``SWITCHYARD_PENDING_STORE``); ``on_step``: a hook called at each step (tests)."""
        self.settings = settings or PendingSettings.from_env()
        self.node_id = node_id or uuid.uuid4().hex
        self._on_step = on_step
        self._closed = threading.Event()
        self._node_ready = threading.Event()
        self._start_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.redis_store = RedisStore(self.settings, self.node_id, self._closed, client)
        streams = store if store is not None else store_from_uri(
            self.settings.store, self.settings.connections.aws_endpoint_url)
        # _on_message is looked up per message: a test makes a started node deaf by replacing it.
        self._subscriber = self.redis_store.listen(lambda m: self._on_message(m), self._node_ready.clear)
        node = NodeContext(self.settings, self.redis_store, self._subscriber, IdSource(),
                           self.check_data_loss, self._step)
        self.reaper = Reaper(self.redis_store, self._closed)
        self.caller = Caller(node, streams, collect=self.reaper.add)
        self.processor = Processor(node, streams, self._closed, started=lambda: bool(self._threads))
        self.watcher = Watcher(self.settings, self.redis_store, self._closed, on_loss=self._on_data_loss,
                               beat_due=self.processor.beat_due)

    # ------------------------------------------------------------ the face

    @property
    def client(self) -> RedisClient:
        """The node's Redis client."""
        return self.redis_store.client

    @property
    def store(self) -> StreamStore | None:
        """Where this node's streams go (the name applications know; read references with it)."""
        return self.caller.streams

    @store.setter
    def store(self, streams: StreamStore | None) -> None:
        self.caller.streams = self.processor.streams = streams

    @property
    def node_channel(self) -> str:
        return self.redis_store.node_channel

    @property
    def data_loss_events(self) -> int:
        """How often this node found that Redis lost its data."""
        return self.watcher.data_loss_events

    def key_tag(self, endpoint: str) -> str:
        """Every key of one endpoint shares this Redis Cluster hash tag (one slot per endpoint)."""
        return self.redis_store.key_tag(endpoint)

    def state_key(self, endpoint: str, request_id: str) -> str:
        return self.redis_store.state_key(endpoint, request_id)

    def pending_key(self, endpoint: str) -> str:
        return self.redis_store.pending_key(endpoint)

    def take_key(self, endpoint: str, take_id: str) -> str:
        return self.redis_store.take_key(endpoint, take_id)

    def endpoint_channel(self, endpoint: str) -> str:
        """Cancellations of an endpoint's popped, not yet claimed requests (processor unknown)."""
        return self.redis_store.endpoint_channel(endpoint)

    # ------------------------------------------------------------- lifecycle

    def start(self) -> PendingQueue:
        """Subscribe the node channel, start the data-loss watch; ready for calls when it returns.
        Starting a started node does nothing (the Lambda handler calls this on every invocation)."""
        with self._start_lock:
            if self._threads:
                return self
            self.watcher.check_guard()  # sets the guard (first check)
            threads = ((self._subscriber.run, "listener"), (self.watcher.run, "watchdog"),
                       (self.reaper.run, "reaper"))
            for target, name in threads:
                thread = threading.Thread(target=target, name=f"pending-{name}-{self.node_id[:8]}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)
            if not self._node_ready.wait(self.settings.retry_window_s):
                raise StoreUnavailableError("could not subscribe this node's channel within the retry window")
        return self

    def close(self) -> None:
        """Stop the background threads; in-flight calls fail, taken requests are cancelled."""
        self._closed.set()
        self.caller.fail_all(lambda _call: PendingError("the pending queue was closed"), keep_first=True)
        self.processor.cancel_all("the pending queue was closed")
        self.redis_store.interrupt_pops()
        self.reaper.wake()  # the reaper unlinks what is left, then ends
        for thread in self._threads:
            thread.join(5)
        self._threads.clear()
        self.redis_store.close()

    def __enter__(self) -> PendingQueue:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

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
        fired), RemoteError (the service failed) or StoreUnavailableError.
        """
        if not self._threads:
            raise PendingError("start() the PendingQueue before calling")
        return self.caller.queue_and_wait(endpoint, body, streams, pickup_timeout, cancel)

    # ------------------------------------------------------- processing side

    def dequeue(self, endpoint: str, wait: float | None = None, *,
                track: bool = True) -> PendingRequest | None:
        """The next request for ``endpoint``, waiting up to ``wait`` s (default: the poll wait) for one.

        ``track``: this node claims the request if it is still running after the claim delay,
        heartbeats for it and watches for cancellation until ``apply_response`` (an in-process
        service); the HTTP API passes False: its polling service's response or first heartbeat
        (``processor_heartbeat``) claims it. Raises StoreUnavailableError (Redis unreachable for
        the retry window) or PendingError (Redis refused the pop: a key of the wrong type, OOM).
        """
        return self.processor.dequeue(endpoint, wait, track)

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
        self.processor.serve(endpoint, handler, stop)

    def apply_response(
        self,
        request: PendingRequest,
        body: Any = None,
        *,
        error: str | None = None,
        streams: Mapping[str, bytes | BinaryIO] | None = None,
    ) -> Delivery:
        """Answer a dequeued request (``error``: the service failed). Returns what became of it."""
        return self.processor.apply_response(request, body, error, streams)

    def respond(self, endpoint: str, request_id: str, take_id: str, message: dict[str, Any]) -> Delivery:
        """Store a response message for a taken request and tell its caller (respond.lua)."""
        return self.processor.respond(endpoint, request_id, take_id, message)

    def processor_heartbeat(self, endpoint: str, request_id: str, take_id: str) -> ProcessorBeat:
        """The processor is alive (the first beat also claims the request); learn whether its work
        should stop (cancelled, caller gone, lost)."""
        return self.processor.processor_heartbeat(endpoint, request_id, take_id)

    # ------------------------------------------------------------ data loss

    def check_data_loss(self) -> bool:
        """Check the guard now; on loss every in-flight call fails and every taken request is cancelled."""
        return self.watcher.check_data_loss()

    def _on_data_loss(self, affected: Callable[[str], bool]) -> None:
        """Fail the calls and cancel the requests of the endpoints whose keys were lost."""
        self.caller.fail_all(lambda call: DataLossError(
            f"request {call.id} to {call.endpoint!r}: Redis lost its data while the request was in flight"),
            only=affected)
        self.processor.cancel_all("Redis lost its data", only=affected)

    # ------------------------------------------------------ node messages

    def _on_message(self, message: dict[str, Any]) -> None:
        kind, data = message["type"], message["data"]
        if kind == "subscribe":
            # First subscription, or a re-subscription after a reconnect: messages may have been
            # missed meanwhile, so every waiting caller checks Redis again. (A missed cancellation
            # reaches a processor at its next heartbeat.)
            channel = message["channel"]
            channel = channel.decode() if isinstance(channel, bytes) else str(channel)
            if channel == self.node_channel:
                self._node_ready.set()
                self.caller.recheck_all()
            else:
                self.processor.channel_subscribed(channel)
            return
        if kind != "message":
            return
        request_id = data[1:1 + ID_LENGTH].decode()
        if data[:1] == RESPONSE_MESSAGE:
            self.caller.deliver(request_id, data[2 + ID_LENGTH:])
        elif data[:1] == CANCEL_MESSAGE:  # on the node channel, or an endpoint's (unclaimed)
            self.processor.cancel(request_id, "the caller cancelled the request")

    # ---------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        """Queue depth, in-flight requests by state and oldest age, per endpoint (SCAN: an admin view)."""
        return self.redis_store.status()


def build_service(settings: PendingSettings, *, client: RedisClient | None = None,
                  store: StreamStore | None = None, node_id: str | None = None) -> PendingQueue:
    """A node on ``settings`` (not started: ``start()`` subscribes and starts its threads)."""
    return PendingQueue(settings, client=client, store=store, node_id=node_id)
