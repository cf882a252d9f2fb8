"""Routemaster's job queue: scheduled (sorted set by run time) -> instant (list) -> pending (one list
per worker, taken with an atomic move) -> acked; a job exists at most once in any state.

A worker that dies holding a job leaves it in its pending list; the scrubber puts it back once the
worker is unseen for ``scrub_after_ms`` (at-least-once), a delivery as a failed one (health points
and backoff: a subscriber whose answer kills workers must not get the next worker at once). A job
that raises, or asks to, is retried later; the worker goes on (Routemaster's thread group stopped
on an unexpected exception).
"""

from __future__ import annotations

from switchyard.bus.errors import UnknownJobError
from switchyard.bus.ports import BusStorePort, QueueLengths
from switchyard.bus.store import QUEUES

__all__ = ["JobQueue", "QueueLengths", "heartbeat", "scrub"]


class JobQueue:
    """One named queue of one bus (its keys and scripts are the store's)."""

    def __init__(self, store: BusStorePort, name: str) -> None:
        if name not in QUEUES:
            raise UnknownJobError(f"unknown queue {name!r}")
        self.store, self.name = store, name

    def pending_key(self, worker_id: str) -> str:
        return self.store.pending_key(self.name, worker_id)

    def push(self, job: str, delay_ms: int = 0) -> int:
        """Queue ``job`` to run in ``delay_ms``; a duplicate is a no-op.
        Returns 1 queued, 2 an already scheduled copy brought forward, 0 left alone."""
        return self.store.push_job(self.name, job, delay_ms)

    def acquire(self, worker_id: str, timeout_s: float) -> str | None:
        """The worker's held job, else the next instant one; None after ``timeout_s`` without one."""
        return self.store.acquire_job(self.name, worker_id, timeout_s)

    def ack(self, worker_id: str, job: str) -> None:
        self.store.ack_job(self.name, worker_id, job)

    def retry(self, worker_id: str, job: str, delay_ms: int) -> None:
        """The job runs again in ``delay_ms`` (pending -> scheduled)."""
        self.store.retry_job(self.name, worker_id, job, delay_ms)

    def promote_due(self, limit: int = 1000) -> int:
        """Scheduled jobs whose time has come become instant; returns how many."""
        return self.store.promote_due(self.name, limit)

    def lengths(self) -> QueueLengths:
        return self.store.job_lengths(self.name)


def heartbeat(store: BusStorePort, worker_ids: list[str]) -> None:
    """These workers are alive (Redis time), so the scrubber leaves their jobs alone."""
    store.heartbeat(worker_ids)


def scrub(store: BusStorePort, max_age_ms: int) -> tuple[int, int]:
    """Put back the pending jobs of workers unseen for ``max_age_ms`` (jobs put back, workers forgotten)."""
    return store.scrub(max_age_ms)
