"""Routemaster's job queue: scheduled (sorted set by run time) -> instant (list) -> pending (one list
per worker, taken with an atomic move) -> acked; a job exists at most once in any state.

A worker that dies holding a job leaves it in its pending list; the scrubber puts it back once the
worker is unseen for ``scrub_after_ms`` (at-least-once), a delivery as a failed one (health points
and backoff: a subscriber whose answer kills workers must not get the next worker at once). A job
that raises, or asks to, is retried later; the worker goes on (Routemaster's thread group stopped
on an unexpected exception).
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.bus.store import QUEUES, BusStore, as_text


@dataclass(frozen=True)
class QueueLengths:
    instant: int
    scheduled: int
    pending: int


class JobQueue:
    """One named queue of one bus."""

    def __init__(self, store: BusStore, name: str) -> None:
        if name not in QUEUES:
            raise ValueError(f"unknown queue {name!r}")
        self.store, self.name = store, name
        self.index_key = store.key("jobs", "index", name)
        self.scheduled_key = store.key("jobs", "scheduled", name)
        self.instant_key = store.key("jobs", "instant", name)
        self.pending_index_key = store.key("jobs", "pending_index", name)

    def pending_key(self, worker_id: str) -> str:
        return self.store.key("jobs", "pending", self.name, worker_id)

    def push(self, job: str, delay_ms: int = 0) -> int:
        """Queue ``job`` to run in ``delay_ms``; a duplicate is a no-op.
        Returns 1 queued, 2 an already scheduled copy brought forward, 0 left alone."""
        return int(self.store.script("push")(keys=[self.index_key],
                                             args=[self.store.prefix, self.name, job, max(0, delay_ms)]))

    def acquire(self, worker_id: str, timeout_s: float) -> str | None:
        """The worker's job: one it still holds (a Redis error interrupted it), else the next instant
        one, moved atomically into its pending list; None after ``timeout_s`` without one."""
        pending = self.pending_key(worker_id)
        held = self.store.redis.lindex(pending, -1)
        if held is not None:
            return as_text(held)
        self.store.redis.sadd(self.pending_index_key, worker_id)
        job = self.store.redis.blmove(self.instant_key, pending, timeout_s, "RIGHT", "LEFT")
        return as_text(job)

    def ack(self, worker_id: str, job: str) -> None:
        self.store.script("ack")(keys=[self.pending_key(worker_id), self.index_key], args=[job])

    def retry(self, worker_id: str, job: str, delay_ms: int) -> None:
        """The job runs again in ``delay_ms`` (pending -> scheduled)."""
        self.store.script("retry")(keys=[self.pending_key(worker_id), self.scheduled_key, self.index_key],
                                   args=[job, max(0, delay_ms)])

    def promote_due(self, limit: int = 1000) -> int:
        """Scheduled jobs whose time has come become instant; returns how many."""
        return int(self.store.script("promote")(keys=[self.scheduled_key, self.instant_key], args=[limit]))

    def lengths(self) -> QueueLengths:
        r = self.store.redis
        pipe = r.pipeline(transaction=False)
        pipe.llen(self.instant_key)
        pipe.zcard(self.scheduled_key)
        pipe.smembers(self.pending_index_key)
        instant, scheduled, workers = pipe.execute()
        pending = 0
        if workers:
            pipe = r.pipeline(transaction=False)
            for worker in workers:
                pipe.llen(self.pending_key(as_text(worker)))
            pending = sum(pipe.execute())
        return QueueLengths(instant=int(instant), scheduled=int(scheduled), pending=int(pending))


def heartbeat(store: BusStore, worker_ids: list[str]) -> None:
    """These workers are alive (Redis time), so the scrubber leaves their jobs alone."""
    store.script("heartbeat")(keys=[store.workers_key], args=worker_ids)


def scrub(store: BusStore, max_age_ms: int) -> tuple[int, int]:
    """Put back the pending jobs of workers unseen for ``max_age_ms``, each delivery among them as a
    failed one of its subscriber (the worker died holding it); (jobs put back, workers forgotten)."""
    s = store.settings
    args = [store.prefix, max_age_ms, s.damage_rate, s.max_backoff_ms, *QUEUES]
    jobs, forgotten = store.script("scrub")(keys=[store.workers_key], args=args)
    return int(jobs), int(forgotten)
