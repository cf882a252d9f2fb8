"""``switchyard bus worker``: one process of delivery threads plus the bus's housekeeping.

Threads (none of which can stop the others, unlike Routemaster's thread group):
- ``worker_threads`` delivery threads, each a worker id with its own pending list on ``main``; when
  every one is busy another is started, up to ``max_threads``, and surplus idle ones end, so slow
  subscribers (each holds at most one thread, and one host and port at most ``host_threads``)
  cannot keep a healthy subscriber's batch waiting;
- one aux thread running housekeeping jobs (autodrop, monitor, scrub) from ``aux``;
- one ticker: promotes due scheduled jobs every ``schedule_interval_ms``, keeps the aux jobs
  queued (job uniqueness keeps one of each across every worker), heartbeats every worker id and
  flushes the process's delivery metrics.

On AWS the same process runs as an ECS service (docs/bus.md): delivery wants long-lived
keep-alive connections to subscribers and blocking pops (a batch leaves within milliseconds of
being due), which a Lambda function re-created every minute would not keep.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from switchyard.bus.delivery import HOST_BUSY_RETRY_MS, Deliverer, HostSlots
from switchyard.bus.errors import StoreError, StoreUnavailableError
from switchyard.bus.housekeeping import aux_intervals, run_aux_job
from switchyard.bus.jobs import JobQueue, heartbeat
from switchyard.bus.metrics import WORKER_COUNTERS
from switchyard.bus.ports import BusStorePort
from switchyard.bus.store import DELIVER
from switchyard.core.observability import logger, metrics

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

    def __init__(self, store: BusStorePort, threads: int | None = None) -> None:
        self.store = store
        self.settings = store.settings
        self.main = JobQueue(store, "main")
        self.aux = JobQueue(store, "aux")
        self.base_threads = threads or self.settings.worker_threads
        self.max_threads = max(self.base_threads, self.settings.max_threads)
        self.process_id = secrets.token_hex(6)
        self._numbers = itertools.count()
        # delivery threads' ids, then the aux thread's; changes under _lock as threads come and go
        self.worker_ids = [f"{self.process_id}.{next(self._numbers)}" for _ in range(self.base_threads)]
        self.worker_ids.append(f"{self.process_id}.aux")
        self.hosts = HostSlots(self.settings.host_threads)
        self.stats = WorkerStats()
        self._flushed: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._delivering = 0  # delivery threads running
        self._idle = 0  # of which waiting for a job

    # -- one job ------------------------------------------------------------------------------

    def run_one(self, queue: JobQueue, worker_id: str, deliverer: Deliverer | None) -> bool:
        """Take and run one job of ``queue``; False if none came within the acquire timeout."""
        job = queue.acquire(worker_id, self.settings.acquire_timeout_s)
        if job is None:
            return False
        if deliverer is not None:
            self._busy()
        try:
            if job.startswith(DELIVER) and deliverer is not None:
                result = deliverer.run(job, queue.pending_key(worker_id))
                if result.outcome == "busy":
                    queue.retry(worker_id, job, HOST_BUSY_RETRY_MS)
                self.stats.add(**{f"deliveries_{result.outcome}": 1,
                                  "events_delivered": result.events if result.outcome == "ok" else 0})
            else:
                run_aux_job(self.store, job)
                queue.ack(worker_id, job)
                self.stats.add(aux_jobs=1)
        except StoreUnavailableError:
            raise  # Redis is away: the job stays pending for this worker id, taken again once it answers
        except Exception:
            # Any other failure of one job: logged, counted, retried later; this thread goes on.
            logger.exception("bus job failed", extra={"job": job.split(":", 1)[0]})
            self.stats.add(job_errors=1)
            queue.retry(worker_id, job, self.settings.job_error_retry_ms)
        finally:
            if deliverer is not None:
                with self._lock:
                    self._idle += 1
        return True

    # -- the delivery threads, elastic --------------------------------------------------------

    def _busy(self) -> None:
        """A delivery thread took a job: if none is left waiting, start one (up to max_threads), so
        that a slow delivery never keeps the next job waiting while there is room."""
        with self._lock:
            self._idle -= 1
            if self._idle > 0 or self._delivering >= self.max_threads or self._stop.is_set():
                return
            worker_id = f"{self.process_id}.{next(self._numbers)}"
            self.worker_ids.insert(-1, worker_id)
            self._start_delivery_thread(worker_id)
        self.stats.add(threads_started=1)

    def _start_delivery_thread(self, worker_id: str) -> None:  # under _lock
        self._delivering += 1
        self._idle += 1
        thread = threading.Thread(target=self._deliver, args=(worker_id,), name=f"bus-deliver-{worker_id}",
                                  daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()]  # the ended ones: a long run starts many
        self._threads.append(thread)
        thread.start()

    def _surplus(self, worker_id: str) -> bool:
        """True (and the thread is forgotten) if this idle thread is one more than needed: above
        worker_threads with another thread waiting for a job."""
        with self._lock:
            if self._delivering <= self.base_threads or self._idle < 2:
                return False
            self._delivering -= 1
            self._idle -= 1
            self.worker_ids.remove(worker_id)
            return True

    def _deliver(self, worker_id: str) -> None:
        deliverer = Deliverer(self.store, hosts=self.hosts)
        try:
            with contextlib.suppress(StoreError):  # else its first job's acquire waits for Redis
                heartbeat(self.store, [worker_id])  # seen before it holds a job: never scrubbed as dead
            self._loop(self.main, worker_id, deliverer)
        finally:
            deliverer.client.close()

    def thread_count(self) -> int:
        """Delivery threads running now."""
        with self._lock:
            return self._delivering

    # -- threads ------------------------------------------------------------------------------

    def _loop(self, queue: JobQueue, worker_id: str, deliverer: Deliverer | None) -> None:
        while not self._stop.is_set():
            try:
                self.run_one(queue, worker_id, deliverer)
            except StoreError as exc:
                logger.warning("bus worker: Redis error", extra={"error": str(exc)})
                self._stop.wait(REDIS_ERROR_PAUSE_S)
            if deliverer is not None and self._surplus(worker_id):
                return

    def _tick_once(self, last: dict[str, float]) -> None:
        now = time.monotonic()
        if now - last.get("heartbeat", 0) >= self.settings.heartbeat_ms / 1000:
            with self._lock:
                alive = list(self.worker_ids)
            heartbeat(self.store, alive)
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
            except StoreError as exc:
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
            metrics.add_metric(name=WORKER_COUNTERS[name], unit=MetricUnit.Count, value=delta)
        metrics.flush_metrics()

    def run(self, stop: threading.Event | None = None) -> None:
        """Run every thread until ``stop`` (or ``close()``); in-flight deliveries finish first."""
        if stop is not None:
            def relay_stop() -> None:
                stop.wait()
                self._stop.set()

            threading.Thread(target=relay_stop, daemon=True).start()
        heartbeat(self.store, list(self.worker_ids))
        aux = threading.Thread(target=self._loop, args=(self.aux, self.worker_ids[-1], None), name="bus-aux",
                               daemon=True)
        self._threads = [threading.Thread(target=self._ticker, name="bus-ticker", daemon=True), aux]
        for t in self._threads:
            t.start()
        with self._lock:
            for worker_id in self.worker_ids[:-1]:
                self._start_delivery_thread(worker_id)
        self._join(None)

    def _join(self, timeout_s: float | None) -> None:
        """Wait for every thread, those started meanwhile too (each at most ``timeout_s``)."""
        joined: set[threading.Thread] = set()
        while True:
            with self._lock:
                left = [t for t in self._threads if t not in joined]
            if not left:
                return
            for t in left:
                t.join(timeout_s)
                joined.add(t)

    def start(self) -> BusWorker:
        threading.Thread(target=self.run, name="bus-worker", daemon=True).start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._join(self.settings.delivery_timeout_s + 5)
