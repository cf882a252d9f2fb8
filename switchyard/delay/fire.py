"""Readying and firing (seed, operation 2), with the firing time set by a timer, not by the poll.

Phase 1 readies, every poll interval, a bounded batch of rows due within the timing advance plus
two poll intervals (the lookahead). Each readied row waits in an in-memory heap and is published
at exactly ``deadline - timing advance``; phase 2 deletes it once the broker confirmed delivery.
So precision is the timer's (about a millisecond), while a readied row is held for at most the
lookahead before publishing: far inside the hold time, so peers do not suspect healthy nodes.
A node that dies holding rows leaves them readied; failure detection resets them after the hold
time and another node fires them (at-least-once, never lost).

A node with nothing due does not poll: a claim that finds nothing asks for the earliest waiting
deadline and the next claim waits for it (or ``idle_poll_ms``), while a listener thread takes
Postgres notifications of new enqueues and brings the next claim forward.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Generic, TypeVar

from switchyard.core import tracing
from switchyard.core.latency import LatencySamples
from switchyard.core.observability import logger
from switchyard.delay.errors import BrokerError, MessageRefusedError, StoreError
from switchyard.delay.model import FireOutcome, LatenessWindow, ReadyMessage
from switchyard.delay.ports import DelayStore, Delivery, Publisher
from switchyard.delay.settings import DelaySettings

DELETE_BATCH = 1000
DELETE_INTERVAL_S = 0.1  # confirmed rows are deleted in batches at least this often (one commit each)
WORKER_CHECK_S = 0.005  # while the store worker is busy, look for its result this often
HARD_STOP_MS = 300  # below this much remaining time, leave at once (failure detection recovers)
# A wake for the timer heap comes this much after the first row's firing time, so that one wake fires
# the rows due meanwhile: at 1,000-2,000 rows/s a wake per row (every ~1 ms) cost 15-20 % more CPU
# (the producer's poll and the GIL hand-over each time), for at most 5 ms of lateness; never early.
FIRE_COALESCE_S = 0.005
# A waiting row due longer ago than this is overdue: the fire loop is behind, or not running.
OVERDUE_AFTER_S = 60.0
LISTEN_WAIT_S = 0.5  # the listener's longest wait for a notification (it checks for stop between)
# Lateness is kept per window of this length (one row per node in fire_lateness, written by phase 2)
# from at most LATENESS_SAMPLES rows of it (the most recent: the figures of a busy window).
LATENESS_WINDOW_S = 10.0
LATENESS_SAMPLES = 4096

Claim = tuple[list[ReadyMessage], float | None]  # rows claimed; if none, the next waiting deadline (epoch s)
_Row = TypeVar("_Row", ReadyMessage, tuple[ReadyMessage, str])


@dataclass(frozen=True)
class Settled(Generic[_Row]):
    """One phase-2 store call: its rows, and the ids it returned or the StoreError it raised.
    ``ran`` is False when there were no rows, so no call (neither ids nor an error then)."""

    rows: list[_Row]
    ids: frozenset[str] = frozenset()
    error: StoreError | None = None

    @property
    def ran(self) -> bool:
        return bool(self.rows)

    @property
    def done(self) -> bool:
        """The call ran and succeeded."""
        return self.ran and self.error is None


def _settle(rows: list[_Row], call: Callable[[list[_Row]], set[str]]) -> Settled[_Row]:
    """``call(rows)``'s result, a StoreError kept for the firing thread rather than raised."""
    if not rows:
        return Settled(rows)
    try:
        return Settled(rows, frozenset(call(rows)))
    except StoreError as exc:
        return Settled(rows, error=exc)


@dataclass(frozen=True)
class Phase2:
    """One round of phase-2 store work: delete fired, release unfired, park refused rows."""

    to_delete: list[ReadyMessage]
    to_release: list[ReadyMessage]
    to_park: list[tuple[ReadyMessage, str]]
    lateness: LatenessWindow | None = None  # a window to record (its failure is only logged)

    def __bool__(self) -> bool:
        return bool(self.to_delete or self.to_release or self.to_park or self.lateness)


@dataclass(frozen=True)
class Phase2Done:
    """What the store did with a ``Phase2``, call by call."""

    deleted: Settled[ReadyMessage]
    released: Settled[ReadyMessage]
    parked: Settled[tuple[ReadyMessage, str]]


class FireLoop:
    """One node's ready-and-fire loop. ``run`` loops until the invocation's remaining time runs short.

    In ``run``, the store's queries (claiming, deleting, releasing) go to one worker thread, so the
    thread that fires never waits for Postgres: a slow claim or delete (a busy machine, a commit)
    delays nothing that is already held, and the lookahead leaves a poll interval of slack for the
    next claim. ``ready_once`` and ``delete_confirmed`` do the same work synchronously.
    """

    def __init__(
        self, store: DelayStore, publisher: Publisher[ReadyMessage], settings: DelaySettings, node_id: str
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.settings = settings
        self.node_id = node_id
        self._heap: list[tuple[float, int, ReadyMessage]] = []
        self._order = itertools.count()
        self._to_delete: list[ReadyMessage] = []
        self._to_release: list[ReadyMessage] = []
        self._to_park: list[tuple[ReadyMessage, str]] = []  # refused for good, with the reason
        self._capacity = 4 * settings.ready_batch_size
        self._advance_s = settings.timing_advance_ms / 1000
        self._poll_s = settings.poll_interval_ms / 1000
        self._idle_s = settings.idle_poll_ms / 1000
        self._horizon_s = settings.ready_horizon.total_seconds()
        self._next_ready = 0.0
        self._last_claim = 0.0
        self._notified = math.inf  # earliest deadline the listener was told of since the last claim
        self._notified_lock = threading.Lock()
        self._last_delete = 0.0
        self._outcome = FireOutcome()  # the run's counters, returned by ``outcome``
        self._lateness = LatencySamples(LATENESS_SAMPLES)  # this window's rows' lateness (ms)
        self._window_start = time.time()
        self._claiming: Future[Claim] | None = None
        self._phase2: Future[Phase2Done] | None = None

    # -- phase 1 -----------------------------------------------------------------------------

    def _held(self) -> int:
        return len(self._heap) + self.publisher.in_flight() + len(self._to_delete)

    def _claim(self) -> Claim:
        rows = self.store.ready(self.node_id, self.settings.ready_horizon, self.settings.ready_batch_size)
        if rows:
            return rows, None
        deadline = self.store.next_deadline()
        return rows, None if deadline is None else deadline.timestamp()

    def _claimed(self, now: float, claim: Claim) -> int:
        rows, next_deadline = claim
        advance, push, heap, order = self._advance_s, heapq.heappush, self._heap, self._order
        for row in rows:
            push(heap, (row.deadline.timestamp() - advance, next(order), row))
        self._outcome.readied += len(rows)
        # Randomised so nodes started together do not query in unison (seed).
        paced = now + self._poll_s * random.uniform(0.9, 1.1)
        if len(rows) >= self.settings.ready_batch_size:
            self._next_ready = now  # a backlog: claim the next batch straight away
        elif rows:
            self._next_ready = paced
        else:  # nothing due: sleep until the earliest waiting row comes within the horizon
            wake = now + self._idle_s * random.uniform(0.9, 1.1)
            if next_deadline is not None:
                wake = min(wake, max(paced, next_deadline - self._horizon_s))
            self._next_ready = wake
        return len(rows)

    def _claim_failed(self, now: float, exc: StoreError) -> None:
        self._outcome.store_errors += 1
        self._next_ready = now + min(1.0, 2 * self._poll_s)
        logger.warning("ready failed; retrying", extra={"error": str(exc), "node_id": self.node_id})

    def ready_once(self, now: float) -> int:
        """Claim due rows into the timer heap; schedules the next claim. Returns the rows claimed."""
        try:
            claim = self._claim()
        except StoreError as exc:
            self._claim_failed(now, exc)
            return 0
        return self._claimed(now, claim)

    def _listen(self, stop: threading.Event) -> None:
        """Listener thread: keep the earliest deadline that enqueues announce, for the firing thread."""
        try:
            while not stop.is_set():
                try:
                    due = self.store.wait_enqueued(LISTEN_WAIT_S)
                except StoreError as exc:  # the idle poll still claims; listen again after a pause
                    logger.warning("enqueue notifications lost; listening again",
                                   extra={"error": str(exc), "node_id": self.node_id})
                    stop.wait(self._idle_s)
                    continue
                if due is not None:
                    with self._notified_lock:
                        self._notified = min(self._notified, due)
        finally:
            self.store.stop_listening()

    def _claim_due_at(self) -> float:
        """When to claim next: as scheduled, or sooner for notified work (at most once a poll interval)."""
        with self._notified_lock:
            notified = self._notified
        if notified == math.inf:
            return self._next_ready
        return min(self._next_ready, max(self._last_claim + self._poll_s, notified - self._horizon_s))

    # -- firing ------------------------------------------------------------------------------

    def fire_due(self, now: float) -> int:
        """Publish every held row whose firing time has come."""
        sent = 0
        heap = self._heap
        while heap and heap[0][0] <= now:
            fire_at, _, row = heapq.heappop(heap)
            late_ms = (now - fire_at) * 1000
            if late_ms > self._outcome.max_late_ms:
                self._outcome.max_late_ms = late_ms
            self._lateness.add(late_ms)
            try:
                self.publisher.send(row.key, row.value, row.headers, row)
                sent += 1
            except MessageRefusedError as exc:
                self._refused(row, str(exc))
            except BrokerError as exc:
                self._outcome.publish_failures += 1
                self._to_release.append(row)
                with tracing.scope_if(tracing.in_pairs(row.headers)):
                    logger.error("publish refused", extra={"message_id": row.id, "error": str(exc)})
        return sent

    def collect(self, deliveries: list[Delivery[ReadyMessage]]) -> None:
        """Sort confirmations: delivered rows are to be deleted, failed ones released."""
        failed: list[Delivery[ReadyMessage]] = []
        to_delete = self._to_delete
        hops = tracing.trace_log_path() is not None  # the local trace log's (``switchyard trace``)
        for d in deliveries:
            row = d.token
            if d.error is None:
                to_delete.append(row)
                if hops:
                    tracing.hop(tracing.in_pairs(row.headers), "delay", "fired", id=row.id,
                                late_ms=round((time.time() - row.deadline.timestamp()) * 1000, 1))
            elif d.refused:
                self._refused(row, d.error)
            else:
                failed.append(d)
                self._to_release.append(row)
        self._outcome.fired += len(deliveries) - len(failed)

        if failed:  # one line per batch: a broker outage must not flood the log
            self._outcome.publish_failures += len(failed)
            logger.error(f"{len(failed)} publications not confirmed; releasing their rows",
                         extra={"message_ids": [d.token.id for d in failed[:10]],
                                "error": failed[0].error, "node_id": self.node_id})

    def _refused(self, row: ReadyMessage, reason: str) -> None:
        """The broker will never take this message: park it (phase 2), do not release it to retry."""
        self._outcome.publish_failures += 1
        self._to_park.append((row, reason))
        with tracing.scope_if(tracing.in_pairs(row.headers)):
            logger.error("message refused by the output broker for good; parking it",
                         extra={"message_id": row.id, "error": reason, "node_id": self.node_id})

    # -- phase 2 -----------------------------------------------------------------------------

    def _phase2_due(self, now: float, force: bool) -> Phase2:
        """The batches to settle now (releases and parks are taken off their lists; deletes stay queued)."""
        due = force or len(self._to_delete) >= DELETE_BATCH or now - self._last_delete >= DELETE_INTERVAL_S
        batch = Phase2(self._to_delete[:DELETE_BATCH] if due else [], self._to_release, self._to_park,
                       self._lateness_window(now, force))
        self._to_release, self._to_park = [], []
        return batch

    def _lateness_window(self, now: float, force: bool) -> LatenessWindow | None:
        """The window's lateness once it is over (or the loop ends), then a new window; None if
        nothing was fired in it."""
        if not (force or now - self._window_start >= LATENESS_WINDOW_S):
            return None
        late = self._lateness.take()
        if late is None:
            return None
        self._window_start = now
        return LatenessWindow(late.count, round(late.p50_ms, 3), round(late.p99_ms, 3), round(late.max_ms, 3))

    def _run_phase2(self, batch: Phase2) -> Phase2Done:
        """Store calls of phase 2; errors are kept in the result for the caller's thread, not raised."""
        done = Phase2Done(_settle(batch.to_delete, self.store.delete),
                          _settle(batch.to_release, partial(self.store.release, self.node_id)),
                          _settle(batch.to_park, partial(self.store.park, self.node_id)))
        if batch.lateness is not None:
            try:
                self.store.record_lateness(self.node_id, batch.lateness)
            except StoreError as exc:  # a figure for people: the firing goes on without it
                logger.warning("recording the fire lateness failed", extra={"error": str(exc)})
        return done

    def _phase2_done(self, now: float, done: Phase2Done) -> None:
        counts, parked, deleted, released = self._outcome, done.parked, done.deleted, done.released
        if parked.error is not None:
            counts.store_errors += 1
            self._to_park.extend(parked.rows)  # still readied by us: park them on the next turn
            logger.warning("park failed; retrying",
                           extra={"error": str(parked.error), "rows": len(parked.rows)})
        counts.parked += len(parked.ids)
        if deleted.error is not None:
            counts.store_errors += 1
            self._last_delete = now + self._poll_s  # back off before retrying
            logger.warning("delete failed; retrying",
                           extra={"error": str(deleted.error), "pending": len(deleted.rows)})
        elif deleted.done:
            del self._to_delete[:len(deleted.rows)]  # only this loop removes from the front
            self._last_delete = now
            counts.deleted += len(deleted.ids)
            if len(deleted.ids) < len(deleted.rows):
                for row in deleted.rows:
                    if row.id not in deleted.ids:
                        counts.gone_at_delete += 1
                        logger.warning(f"message {row.id} already gone at delete time (a peer took it over?)",
                                       extra={"message_id": row.id, "node_id": self.node_id})
        if released.error is not None:
            # Still readied by us: failure detection resets them after the hold time.
            counts.store_errors += 1
            logger.warning("release failed; failure detection will reset the rows",
                           extra={"error": str(released.error), "rows": len(released.rows)})
        counts.released += len(released.ids)

    def delete_confirmed(self, now: float, force: bool = False) -> None:
        """Delete confirmed rows in batches; keep them for a retry if Postgres is unavailable."""
        batch = self._phase2_due(now, force)
        if batch:
            self._phase2_done(now, self._run_phase2(batch))

    # -- the store worker ----------------------------------------------------------------------

    def _reap(self) -> None:
        """Take in what the store worker finished (on this thread: the heap and counters are ours)."""
        if self._claiming is not None and self._claiming.done():
            job, self._claiming = self._claiming, None
            try:
                self._claimed(time.time(), job.result())
            except StoreError as exc:
                self._claim_failed(time.time(), exc)
        if self._phase2 is not None and self._phase2.done():
            settled, self._phase2 = self._phase2, None
            self._phase2_done(time.time(), settled.result())

    def _submit(self, worker: ThreadPoolExecutor, now: float, accepting: bool) -> None:
        """Hand the worker a claim and a phase-2 batch when due, one of each at a time."""
        if (self._claiming is None and accepting and now >= self._claim_due_at()
                and self._held() < self._capacity):
            with self._notified_lock:
                self._notified = math.inf  # this claim sees everything committed before it
            self._last_claim = now
            self._claiming = worker.submit(self._claim)
        if self._phase2 is None:
            batch = self._phase2_due(now, force=not accepting)
            if batch:
                self._phase2 = worker.submit(self._run_phase2, batch)

    # -- the loop ----------------------------------------------------------------------------

    def _idle_timeout(self, accepting: bool) -> float:
        now = time.time()
        wake = now + self._poll_s
        if self._heap:
            wake = min(wake, self._heap[0][0] + FIRE_COALESCE_S)
        if self._claiming is not None or self._phase2 is not None:
            wake = min(wake, now + WORKER_CHECK_S)  # take its result in soon
        else:
            if accepting and self._held() < self._capacity:
                wake = min(wake, self._claim_due_at())
            if self._to_delete or self._to_release or self._to_park:
                wake = min(wake, self._last_delete + DELETE_INTERVAL_S)
        # librdkafka waits in whole milliseconds and truncates: round up, or a wait under 1 ms
        # becomes poll(0) and the loop spins. Firing is thus at most ~1 ms late, never early.
        return math.ceil(max(0.0, wake - now) * 1000) / 1000

    def step(self, worker: ThreadPoolExecutor, accepting: bool) -> None:
        """One turn: fire what is due, hand store work to the worker, handle confirmations, then wait."""
        self.fire_due(time.time())
        self._reap()
        self.fire_due(time.time())
        self.collect(self.publisher.poll(0))
        self._submit(worker, time.time(), accepting)
        self.collect(self.publisher.poll(self._idle_timeout(accepting)))

    def busy(self) -> bool:
        return bool(self._heap or self._to_delete or self._to_release or self._to_park
                    or self.publisher.in_flight()
                    or self._claiming is not None or self._phase2 is not None)

    def run(self, remaining_ms: Callable[[], int]) -> FireOutcome:
        """Loop until less than the stop margin remains, then fire and confirm what is held, and return."""
        margin = self.settings.stop_margin_ms
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delay-store")
        stop_listening = threading.Event()
        listener = threading.Thread(target=self._listen, args=(stop_listening,), name="delay-listen",
                                    daemon=True)
        listener.start()
        try:
            while remaining_ms() > margin:
                self.step(worker, accepting=True)
            drain_until = time.monotonic() + margin / 1000
            while self.busy() and remaining_ms() > HARD_STOP_MS and time.monotonic() < drain_until:
                self.step(worker, accepting=False)
        finally:
            stop_listening.set()
            worker.shutdown(wait=True)  # a query in flight finishes (its rows are taken in below)
            listener.join(LISTEN_WAIT_S + 5.0)  # it closes its connection as it ends
            self._reap()
        if self.busy():
            logger.warning("stopping with rows still held; failure detection will reset them",
                           extra={"held": self._held(), "node_id": self.node_id})
        self._count_overdue()
        return self.outcome()

    def _count_overdue(self) -> None:
        """The backlog, for its alarm: rows due over ``OVERDUE_AFTER_S`` ago that nobody claimed."""
        before = datetime.now(UTC) - timedelta(seconds=OVERDUE_AFTER_S)
        try:
            self._outcome.overdue = self.store.overdue(before)
        except StoreError:
            self._outcome.overdue = -1
            logger.exception("counting overdue messages failed")

    def outcome(self) -> FireOutcome:
        return replace(self._outcome, max_late_ms=round(self._outcome.max_late_ms, 3))
