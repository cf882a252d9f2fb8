"""A node's housekeeping: the data-loss watch, the heartbeats of its tracked requests, the reaper.

Data loss: each node swaps a random guard value in every ``data_loss_check_s`` (``SET ... GET``,
one command, TTL ``data_loss_guard_ttl_s``; on a Redis Cluster one guard per shard, tagged into its
slots); if it is gone, Redis (that shard) lost its data, and every in-flight call fails and every
taken request is cancelled (of the endpoints whose keys live on that shard). Heartbeats are timestamps in the
request's state written by Lua with Redis's clock: one command per interval both beats and checks
the other side. The reaper unlinks answered states in batches, off the callers' path.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from switchyard.pending import metrics
from switchyard.pending.errors import PendingError, StoreUnavailableError
from switchyard.pending.ports import PendingStore
from switchyard.pending.settings import PendingSettings

logger = logging.getLogger(__name__)

# Answered states are unlinked in batches, off the callers' path: at most this late (their TTL
# covers a node that dies first) or as soon as this many piled up. One UNLINK per endpoint tag.
REAP_INTERVAL_S = 0.1
REAP_BATCH = 256


class Watcher:
    """The data-loss guard and the watch thread (guard checks, tracked requests' heartbeats)."""

    def __init__(self, settings: PendingSettings, store: PendingStore, closed: threading.Event, *,
                 on_loss: Callable[[Callable[[str], bool]], None], beat_due: Callable[[], None]) -> None:
        self.settings = settings
        self._store = store
        self._closed = closed
        self._on_loss = on_loss  # fail the calls, cancel the tracked requests (of the endpoints accepted)
        self._beat_due = beat_due
        self._guard_token = uuid.uuid4().hex
        self._guard_set_at: dict[str, float] = {}  # wall-clock time each guard was last set
        self.data_loss_events = 0

    def check_guard(self) -> list[str]:
        """Swap the guards in (SET ... GET, one command each); the guards that had vanished (Redis,
        or that shard, lost data).

        A guard last set longer ago than its TTL may simply have expired (a Lambda environment
        frozen for hours): that re-arms it and is no loss. Wall-clock time, which runs while frozen.
        A guard never set (the first check, or a shard new to the slot map) is no loss either.
        """
        ttl_s = self.settings.data_loss_guard_ttl_s
        replies = self._store.swap_guards(self._guard_token, ttl_s)
        now = time.time()
        token = self._guard_token.encode()
        lost = [key for key, previous in replies.items()
                if now - self._guard_set_at.get(key, -ttl_s) < ttl_s and previous != token]
        self._guard_set_at.update(dict.fromkeys(replies, now))
        return lost

    def check_data_loss(self) -> bool:
        """Check the guards now; on loss the in-flight calls fail and the taken requests are
        cancelled, of the endpoints whose keys live where the guard vanished."""
        try:
            lost = self.check_guard()
        except StoreUnavailableError:
            return False
        if lost:
            self.data_loss_events += 1
            metrics.count(metrics.PENDING_DATA_LOSS_EVENTS)
            slots = [self._store.guard_keys().get(key, (0, 16383)) for key in lost]
            logger.error("Redis lost its data (guard %s of node %s vanished): failing in-flight requests",
                         ", ".join(lost), self._store.node_id)
            self._on_loss(lambda endpoint: any(self._store.endpoint_in(endpoint, s) for s in slots))
        return bool(lost)

    def run(self) -> None:
        """The watch thread: data-loss checks and the heartbeats of tracked (in-process) requests."""
        s = self.settings
        next_guard = time.monotonic() + s.data_loss_check_s
        while not self._closed.wait(min(1.0, s.heartbeat_interval_s / 4, s.data_loss_check_s)):
            now = time.monotonic()
            if now >= next_guard:
                next_guard = now + s.data_loss_check_s
                try:
                    self.check_data_loss()
                except PendingError as exc:  # refused (OOM...): the next check tries again
                    logger.warning("data-loss check failed: %s", exc)
            self._beat_due()


class Reaper:
    """Unlinks answered states every REAP_INTERVAL_S (sooner when REAP_BATCH piled up): one round
    trip, one UNLINK per endpoint (its keys share one cluster slot), instead of one per call."""

    def __init__(self, store: PendingStore, closed: threading.Event) -> None:
        self._store = store
        self._closed = closed
        self._lock = threading.Lock()
        self._answered: dict[str, list[str]] = {}  # endpoint -> request ids of answered states
        self._count = 0
        self._wake = threading.Event()

    def add(self, endpoint: str, request_id: str) -> None:
        """An answered state to unlink (its TTL removes it if this process dies first)."""
        with self._lock:
            self._answered.setdefault(endpoint, []).append(request_id)
            self._count += 1
            full = self._count >= REAP_BATCH
        if full:
            self._wake.set()

    def wake(self) -> None:
        """Unlink now (the node closes: the reaper unlinks what is left, then ends)."""
        self._wake.set()

    def run(self) -> None:
        while True:
            self._wake.wait(REAP_INTERVAL_S)
            self._wake.clear()
            with self._lock:
                batches, self._answered, self._count = self._answered, {}, 0
            if batches:
                self._store.unlink_answered(batches)
            if self._closed.is_set():
                return
