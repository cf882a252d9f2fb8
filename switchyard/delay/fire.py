"""Readying and firing (seed, operation 2), with the firing time set by a timer, not by the poll.

Phase 1 readies, every poll interval, a bounded batch of rows due within the timing advance plus
two poll intervals (the lookahead). Each readied row waits in an in-memory heap and is published
at exactly ``deadline - timing advance``; phase 2 deletes it once the broker confirmed delivery.
So precision is the timer's (about a millisecond), while a readied row is held for at most the
lookahead before publishing: far inside the hold time, so peers do not suspect healthy nodes.
A node that dies holding rows leaves them readied; failure detection resets them after the hold
time and another node fires them (at-least-once, never lost).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from switchyard.delay.errors import PublishError, StoreError
from switchyard.delay.model import FireOutcome, ReadyMessage
from switchyard.delay.ports import DelayStore, Delivery, Publisher
from switchyard.delay.settings import DelaySettings
from switchyard.observability import logger

DELETE_BATCH = 1000
DELETE_INTERVAL_S = 0.1  # confirmed rows are deleted in batches at least this often (one commit each)
HARD_STOP_MS = 300  # below this much remaining time, leave at once (failure detection recovers)


@dataclass
class _Counters:
    readied: int = 0
    fired: int = 0
    deleted: int = 0
    gone_at_delete: int = 0
    publish_failures: int = 0
    released: int = 0
    store_errors: int = 0
    max_late_ms: float = 0.0


class FireLoop:
    """One node's ready-and-fire loop. ``run`` loops until the invocation's remaining time runs short."""

    def __init__(
        self, store: DelayStore, publisher: Publisher, settings: DelaySettings, node_id: str
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.settings = settings
        self.node_id = node_id
        self._heap: list[tuple[float, int, ReadyMessage]] = []
        self._order = itertools.count()
        self._to_delete: list[ReadyMessage] = []
        self._to_release: list[ReadyMessage] = []
        self._capacity = 4 * settings.ready_batch_size
        self._advance_s = settings.timing_advance_ms / 1000
        self._poll_s = settings.poll_interval_ms / 1000
        self._next_ready = 0.0
        self._last_delete = 0.0
        self._c = _Counters()

    # -- phase 1 -----------------------------------------------------------------------------

    def _held(self) -> int:
        return len(self._heap) + self.publisher.in_flight() + len(self._to_delete)

    def ready_once(self, now: float) -> int:
        """Claim due rows into the timer heap; schedules the next claim. Returns the rows claimed."""
        try:
            rows = self.store.ready(self.node_id, self.settings.ready_horizon, self.settings.ready_batch_size)
        except StoreError as exc:
            self._c.store_errors += 1
            self._next_ready = now + min(1.0, 2 * self._poll_s)
            logger.warning("ready failed; retrying", extra={"error": str(exc), "node_id": self.node_id})
            return 0
        for row in rows:
            heapq.heappush(self._heap, (row.deadline.timestamp() - self._advance_s, next(self._order), row))
        self._c.readied += len(rows)
        if len(rows) >= self.settings.ready_batch_size:
            self._next_ready = now  # a backlog: claim the next batch straight away
        else:
            # Randomised so nodes started together do not query in unison (seed).
            self._next_ready = now + self._poll_s * random.uniform(0.9, 1.1)
        return len(rows)

    # -- firing ------------------------------------------------------------------------------

    def fire_due(self, now: float) -> int:
        """Publish every held row whose firing time has come."""
        sent = 0
        while self._heap and self._heap[0][0] <= now:
            fire_at, _, row = heapq.heappop(self._heap)
            late_ms = (now - fire_at) * 1000
            if late_ms > self._c.max_late_ms:
                self._c.max_late_ms = late_ms
            try:
                self.publisher.send(row.key, row.value, row.headers, row)
                sent += 1
            except PublishError as exc:
                self._c.publish_failures += 1
                self._to_release.append(row)
                logger.error("publish refused", extra={"message_id": row.id, "error": str(exc)})
        return sent

    def collect(self, deliveries: list[Delivery]) -> None:
        """Sort confirmations: delivered rows are to be deleted, failed ones released."""
        failed: list[Delivery] = []
        for d in deliveries:
            row = d.token
            assert isinstance(row, ReadyMessage)
            if d.error is None:
                self._c.fired += 1
                self._to_delete.append(row)
            else:
                failed.append(d)
                self._to_release.append(row)
        if failed:  # one line per batch: a broker outage must not flood the log
            self._c.publish_failures += len(failed)
            logger.error(f"{len(failed)} publications not confirmed; releasing their rows",
                         extra={"message_ids": [d.token.id for d in failed[:10]],  # type: ignore[attr-defined]
                                "error": failed[0].error, "node_id": self.node_id})

    # -- phase 2 -----------------------------------------------------------------------------

    def delete_confirmed(self, now: float, force: bool = False) -> None:
        """Delete confirmed rows in batches; keep them for a retry if Postgres is unavailable."""
        due = force or len(self._to_delete) >= DELETE_BATCH or now - self._last_delete >= DELETE_INTERVAL_S
        if self._to_delete and due:
            batch = self._to_delete[:DELETE_BATCH]
            try:
                deleted = self.store.delete(batch)
            except StoreError as exc:
                self._c.store_errors += 1
                self._last_delete = now + self._poll_s  # back off before retrying
                logger.warning("delete failed; retrying", extra={"error": str(exc), "pending": len(batch)})
            else:
                del self._to_delete[:len(batch)]
                self._last_delete = now
                self._c.deleted += len(deleted)
                for row in batch:
                    if row.id not in deleted:
                        self._c.gone_at_delete += 1
                        logger.warning(f"message {row.id} already gone at delete time (a peer took it over?)",
                                       extra={"message_id": row.id, "node_id": self.node_id})
        if self._to_release:
            batch, self._to_release = self._to_release, []
            try:
                self._c.released += len(self.store.release(self.node_id, batch))
            except StoreError as exc:
                # Still readied by us: failure detection resets them after the hold time.
                self._c.store_errors += 1
                logger.warning("release failed; failure detection will reset the rows",
                               extra={"error": str(exc), "rows": len(batch)})

    # -- the loop ----------------------------------------------------------------------------

    def _idle_timeout(self, accepting: bool) -> float:
        now = time.time()
        wake = now + self._poll_s
        if self._heap:
            wake = min(wake, self._heap[0][0])
        if accepting and self._held() < self._capacity:
            wake = min(wake, self._next_ready)
        if self._to_delete or self._to_release:
            wake = min(wake, self._last_delete + DELETE_INTERVAL_S)
        # librdkafka waits in whole milliseconds and truncates: round up, or a wait under 1 ms
        # becomes poll(0) and the loop spins. Firing is thus at most ~1 ms late, never early.
        return math.ceil(max(0.0, wake - now) * 1000) / 1000

    def step(self, accepting: bool) -> None:
        """One turn: claim if it is time, fire what is due, handle confirmations, delete, then wait."""
        now = time.time()
        if accepting and now >= self._next_ready and self._held() < self._capacity:
            self.ready_once(now)
        self.fire_due(time.time())
        self.collect(self.publisher.poll(0))
        self.delete_confirmed(time.time(), force=not accepting)
        self.collect(self.publisher.poll(self._idle_timeout(accepting)))

    def busy(self) -> bool:
        return bool(self._heap or self._to_delete or self._to_release or self.publisher.in_flight())

    def run(self, remaining_ms: Callable[[], int]) -> FireOutcome:
        """Loop until less than the stop margin remains, then fire and confirm what is held, and return."""
        margin = self.settings.stop_margin_ms
        while remaining_ms() > margin:
            self.step(accepting=True)
        drain_until = time.monotonic() + margin / 1000
        while self.busy() and remaining_ms() > HARD_STOP_MS and time.monotonic() < drain_until:
            self.step(accepting=False)
        if self.busy():
            logger.warning("stopping with rows still held; failure detection will reset them",
                           extra={"held": self._held(), "node_id": self.node_id})
        return self.outcome()

    def outcome(self) -> FireOutcome:
        c = self._c
        return FireOutcome(c.readied, c.fired, c.deleted, c.gone_at_delete, c.publish_failures, c.released,
                           c.store_errors, round(c.max_late_ms, 3))
