"""``switchyard bus worker``: one process of delivery threads plus the bus's housekeeping.

Threads (none of which can stop the others, unlike Routemaster's thread group):
- ``worker_threads`` delivery threads, each a worker id with its own pending list on ``main``;
- one aux thread running housekeeping jobs (autodrop, monitor, scrub) from ``aux``;
- one ticker: promotes due scheduled jobs every ``schedule_interval_ms``, keeps the aux jobs
  queued (job uniqueness keeps one of each across every worker), heartbeats every worker id and
  flushes the process's delivery metrics.

On AWS the same process runs as an ECS service (see the README): delivery wants long-lived
keep-alive connections to subscribers and blocking pops (a batch leaves within milliseconds of
being due), which a Lambda function re-created every minute would not keep.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import redis

from switchyard.bus.delivery import Deliverer
from switchyard.bus.housekeeping import aux_intervals, run_aux_job
from switchyard.bus.jobs import JobQueue, heartbeat
from switchyard.bus.store import DELIVER, BusStore
from switchyard.observability import logger, metrics

REDIS_ERROR_PAUSE_S = 1.0


@dataclass
class WorkerStats:
    """Counts of this process, since start (also flushed as metrics every monitor interval)."""

    counts: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **counts: int) -> None:
        with self.lock:
            self.counts.update(counts)

    def take(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)


class BusWorker:
    """Run with ``run(stop)`` until ``stop`` is set; ``start()``/``close()`` run it on a thread."""

    def __init__(self, store: BusStore, threads: int | None = None) -> None:
        self.store = store
        self.settings = store.settings
        self.main = JobQueue(store, "main")
        self.aux = JobQueue(store, "aux")
        n = threads or self.settings.worker_threads
        self.process_id = secrets.token_hex(6)
        self.worker_ids = [f"{self.process_id}.{i}" for i in range(n)] + [f"{self.process_id}.aux"]
        self.stats = WorkerStats()
        self._flushed: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- one job ------------------------------------------------------------------------------

    def run_one(self, queue: JobQueue, worker_id: str, deliverer: Deliverer | None) -> bool:
        """Take and run one job of ``queue``; False if none came within the acquire timeout."""
        job = queue.acquire(worker_id, self.settings.acquire_timeout_s)
        if job is None:
            return False
        try:
            if job.startswith(DELIVER) and deliverer is not None:
                result = deliverer.run(job, queue.pending_key(worker_id))
                self.stats.add(**{f"deliveries_{result.outcome}": 1,
                                  "events_delivered": result.events if result.outcome == "ok" else 0})
            else:
                run_aux_job(self.store, job)
                queue.ack(worker_id, job)
                self.stats.add(aux_jobs=1)
        except (redis.ConnectionError, redis.TimeoutError):
            raise  # Redis is away: the job stays pending for this worker id, taken again once it answers
        except Exception:
            # Any other failure of one job: logged, counted, retried later; this thread goes on.
            logger.exception("bus job failed", extra={"job": job.split(":", 1)[0]})
            self.stats.add(job_errors=1)
            queue.retry(worker_id, job, self.settings.job_error_retry_ms)
        return True

    # -- threads ------------------------------------------------------------------------------

    def _loop(self, queue: JobQueue, worker_id: str, deliverer: Deliverer | None) -> None:
        while not self._stop.is_set():
            try:
                self.run_one(queue, worker_id, deliverer)
            except redis.RedisError as exc:
                logger.warning("bus worker: Redis error", extra={"error": str(exc)})
                self._stop.wait(REDIS_ERROR_PAUSE_S)

    def _tick_once(self, last: dict[str, float]) -> None:
        now = time.monotonic()
        if now - last.get("heartbeat", 0) >= self.settings.heartbeat_ms / 1000:
            heartbeat(self.store, self.worker_ids)
            last["heartbeat"] = now
        self.main.promote_due()
        self.aux.promote_due()
        if now - last.get("aux", 0) >= 1.0:
            for job, interval in aux_intervals(self.store).items():
                self.aux.push(job, interval)
            last["aux"] = now
        if now - last.get("metrics", 0) >= self.settings.monitor_interval_ms / 1000:
            self.flush_metrics()
            last["metrics"] = now

    def _ticker(self) -> None:
        last: dict[str, float] = {}
        while not self._stop.is_set():
            try:
                self._tick_once(last)
            except redis.RedisError as exc:
                logger.warning("bus ticker: Redis error", extra={"error": str(exc)})
            self._stop.wait(self.settings.schedule_interval_ms / 1000)

    def flush_metrics(self) -> None:
        """This process's counts since the last flush, as Powertools metrics."""
        from aws_lambda_powertools.metrics import MetricUnit

        counts = self.stats.take()
        deltas = {name: value - self._flushed.get(name, 0) for name, value in counts.items()}
        self._flushed = counts
        if not any(deltas.values()):
            return
        for name, delta in deltas.items():
            metric = "Bus" + "".join(part.capitalize() for part in name.split("_"))
            metrics.add_metric(name=metric, unit=MetricUnit.Count, value=delta)
        metrics.flush_metrics()

    def run(self, stop: threading.Event | None = None) -> None:
        """Run every thread until ``stop`` (or ``close()``); in-flight deliveries finish first."""
        if stop is not None:
            threading.Thread(target=lambda: (stop.wait(), self._stop.set()), daemon=True).start()
        heartbeat(self.store, self.worker_ids)
        self._threads = [threading.Thread(target=self._ticker, name="bus-ticker", daemon=True),
                         threading.Thread(target=self._loop, args=(self.aux, self.worker_ids[-1], None),
                                          name="bus-aux", daemon=True)]
        for worker_id in self.worker_ids[:-1]:
            args = (self.main, worker_id, Deliverer(self.store))
            self._threads.append(threading.Thread(target=self._loop, args=args,
                                                  name=f"bus-deliver-{worker_id}", daemon=True))
        for t in self._threads:
            t.start()
        for t in self._threads:
            t.join()

    def start(self) -> BusWorker:
        threading.Thread(target=self.run, name="bus-worker", daemon=True).start()
        return self

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.settings.delivery_timeout_s + 5)
