"""The keyed-RPC demo: a fresh pool whose control plane runs locally, called from cold to idle.

Calls go to keys that have no workers; groups start by themselves, traffic flows, a handler error
comes back as a negative response, a request stuck behind a slow worker comes back ``expired``, and
once idle the groups unbind and stop. The pool is deleted at the end unless the run keeps it.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from switchyard.cli.options import show
from switchyard.core.latency import LatencySummary
from switchyard.demo.printer import Printer
from switchyard.demo.spark_job import spark_part

if TYPE_CHECKING:
    from switchyard.local.rpc_runtime import LocalControlPlane
    from switchyard.rpc.client import ClientStats, RpcClient
    from switchyard.rpc.drivers import SubprocessDriver, WorkerGroupDriver
    from switchyard.rpc.settings import RpcSettings

KEYS = ("infra=42", "infra=7", "🚂 express", "timetable #12", "infra=99", "infra=3")


@dataclass(frozen=True)
class PoolOptions:
    """What the person chose on the command line (``switchyard demo --help``)."""

    pool: str | None = None
    keys: int = 4
    seconds: float = 5.0
    concurrency: int = 32
    unbind_delay: float = 3.0
    stop_delay: float = 3.0
    keep: bool = False
    spark: bool = True  # the Spark job's step (it needs the delay scheduler's services too)


@dataclass(frozen=True)
class PoolRun:
    """What the summary reports of the pool's run."""

    pool: str
    kept: bool
    cold: dict[str, float]  # key -> seconds to its first response
    stats: ClientStats
    runtime: LocalControlPlane


class StateWatcher:
    """Records each group's transitions (active, unbound, running, stopped) as they happen."""

    def __init__(self, runtime: LocalControlPlane, pool: str) -> None:
        self.runtime = runtime
        self.pool = pool
        self.events: list[tuple[float, str, str]] = []
        self._seen: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="demo-watcher")

    def start(self) -> StateWatcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            groups = self.runtime.plane.state.groups()
            running = self.runtime.driver.list_running(self.pool)
            for key in set(groups) | set(self._seen) | running:
                group = groups.get(key)
                workers = "workers up" if key in running else "no workers"
                status = f"{group.status.value}, {workers}" if group else "stopped, queue deleted"
                if self._seen.get(key) != status:
                    self._seen[key] = status
                    self.events.append((time.monotonic(), key, status))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def current(self) -> dict[str, str]:
        return dict(self._seen)


def pipelined(client: RpcClient, keys: list[str], seconds: float, concurrency: int,
              ) -> tuple[dict[str, list[float]], Counter[str], Counter[str]]:
    """Keep ``concurrency`` calls in flight over ``keys`` for ``seconds``: latencies per key,
    response statuses and failures by exception name."""
    latencies: dict[str, list[float]] = defaultdict(list)
    statuses: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    done = threading.Event()
    lock = threading.Lock()
    in_flight = [0]
    counter = [0]

    def launch() -> None:
        with lock:
            if time.monotonic() >= deadline:
                if in_flight[0] == 0:
                    done.set()
                return
            counter[0] += 1
            n = counter[0]
            in_flight[0] += 1
        key = keys[n % len(keys)]
        sent = time.perf_counter()
        future = client.submit(key, f"call {n}", timeout=10)
        future.add_done_callback(partial(finish, key=key, sent=sent))

    def finish(future: Future, key: str, sent: float) -> None:
        elapsed = time.perf_counter() - sent
        error = future.exception()
        with lock:
            in_flight[0] -= 1
            if error is not None:
                failures[type(error).__name__] += 1
            else:
                statuses[future.result().status] += 1
                latencies[key].append(elapsed)
        launch()

    for _ in range(concurrency):
        launch()
    done.wait(seconds + 30)
    return latencies, statuses, failures


def cold_start(out: Printer, client: RpcClient, keys: list[str]) -> dict[str, float]:
    """Step 1: keys without workers get their groups started by the control plane; the wait is timed."""
    out.section(f"1. Cold start: calling {len(keys)} keys that have no workers yet")
    started = {key: time.perf_counter() for key in keys}
    futures = {key: client.submit(key, "hello") for key in keys}
    cold: dict[str, float] = {}
    for key, future in futures.items():
        response = future.result(30)
        cold[key] = time.perf_counter() - started[key]
        out.line(f"{key!r:18} {response.status:6} first response after {cold[key] * 1000:6.0f} ms"
                 f"  <- {response.text()[:60]}")
    return cold


def traffic(out: Printer, client: RpcClient, keys: list[str], options: PoolOptions) -> None:
    """Step 2: sustained calls over the now warm keys, with the rate and latencies per key."""
    out.section(f"2. Traffic: {options.seconds:g} s with {options.concurrency} calls in flight over "
                f"{len(keys)} keys")
    t0 = time.perf_counter()
    latencies, statuses, failures = pipelined(client, keys, options.seconds, options.concurrency)
    wall = time.perf_counter() - t0
    everything = [x for values in latencies.values() for x in values]
    total = sum(statuses.values()) + sum(failures.values())
    out.line(f"{total:,} calls in {wall:.1f} s = {total / wall:,.0f} calls/s; "
             f"{LatencySummary.of(everything)}")
    out.line("statuses: " + ", ".join(f"{s} {n:,}" for s, n in statuses.most_common())
             + (f"; failures: {dict(failures)}" if failures else "; no failures"))
    for key in keys:
        out.line(f"  {key!r:18} {len(latencies[key]):6,} calls, {LatencySummary.of(latencies[key])}")


def negative_responses(out: Printer, client: RpcClient) -> None:
    """Step 3: a handler's exception is an answer (``error``), not a timeout."""
    out.section("3. Negative responses: the handler's error comes back at once, no timeout")
    client.call("math", "6/3")  # cold start of 'math', not timed
    for body in ("6/3", "1/0", "oops"):
        response = client.call("math", body)
        out.line(f"math {body!r:7} -> {response.status:5} {response.text()[:70]}")


def expiration(out: Printer, client: RpcClient, prefetch: int) -> None:
    """Step 4: a request queued behind a busy worker past its expiration is answered ``expired``."""
    out.section(f"4. Expiration: 'slow' takes 1 s per request and its worker holds {prefetch}; "
                "the next may wait 0.5 s")
    client.call("slow", "warm up", timeout=20)
    busy = [client.submit("slow", f"busy {i}", timeout=20) for i in range(prefetch)]
    time.sleep(0.2)
    t1 = time.perf_counter()
    late = client.call("slow", "late", timeout=10, expiration_ms=500)
    out.line(f"request behind them -> {late.status!r} after {time.perf_counter() - t1:.2f} s "
             f"(answered by the dead-letter responder)")
    out.line(f"the {prefetch} busy ones -> {sorted({f.result(20).status for f in busy})}")


def idle(out: Printer, runtime: LocalControlPlane, driver: WorkerGroupDriver, watcher: StateWatcher,
         pool: str, options: PoolOptions) -> None:
    """Step 6: no more calls; the watcher's transitions show each group unbind, then stop."""
    out.section(f"6. Idle: groups unbind after {options.unbind_delay:g} s, "
                f"stop {options.stop_delay:g} s later")
    idle_from = time.monotonic()
    deadline = idle_from + options.unbind_delay + options.stop_delay + 20
    while time.monotonic() < deadline and (runtime.plane.state.groups() or driver.list_running(pool)):
        time.sleep(0.2)
    for at, key, status in watcher.events:
        if at >= idle_from:
            out.line(f"+{at - idle_from:5.1f} s  {key!r:18} {status}")
    left = runtime.plane.state.groups()
    out.line("all groups stopped and their queues deleted" if not left and not driver.list_running(pool)
             else f"still up after the wait: {sorted(left)}")


def demo_driver() -> SubprocessDriver:
    """Workers as subprocesses running the demo handler (its ``slow`` and ``math`` keys)."""
    from switchyard.core.settings import LOG_LEVEL
    from switchyard.rpc.drivers import SubprocessDriver

    return SubprocessDriver(
        (sys.executable, "-m", "switchyard.rpc.worker", "--handler", "switchyard.rpc.examples:demo"),
        min_workers=1, max_workers=2, stop_timeout=5,
        env={"SLEEPY_SECONDS": "1", LOG_LEVEL.name: "ERROR"},
    )


def rpc_pool_part(out: Printer, options: PoolOptions, settings: RpcSettings) -> PoolRun:
    """Steps 1 to 6 on a fresh pool (5 is the Spark job, while the pool runs), then its clean-up."""
    from switchyard.core.redis_client import connect_redis
    from switchyard.local.rpc_runtime import LocalControlPlane
    from switchyard.rpc.amqp import redact
    from switchyard.rpc.client import RpcClient
    from switchyard.rpc.control.topology import PoolTopology
    from switchyard.rpc.settings import ControlSettings, Delays
    from switchyard.rpc.store import PoolState

    pool = options.pool or f"demo_{uuid.uuid4().hex[:6]}"
    keys = list(KEYS[: max(1, min(options.keys, len(KEYS)))])
    control = ControlSettings(pool, Delays(unbind_s=options.unbind_delay, stop_s=options.stop_delay),
                              reconcile_interval_s=0.5)
    driver = demo_driver()
    show("Switchyard demo: keyed RPC over RabbitMQ with self-managing worker groups")
    out.line(f"pool {pool} on {redact(settings.connections.amqp_url)} "
             f"({settings.policy.queue_type.value} request queues), pool state in Redis")
    out.line(f"control plane: local runtime running the Lambda handlers; workers as subprocesses; "
             f"unbind after {options.unbind_delay:g} s idle, stop after {options.stop_delay:g} s unbound")

    runtime = LocalControlPlane(control, settings, driver).start()
    watcher = StateWatcher(runtime, pool).start()
    try:
        with RpcClient(pool, settings, concurrency=options.concurrency, timeout=15) as client:
            cold = cold_start(out, client, keys)
            traffic(out, client, keys, options)
            negative_responses(out, client)
            expiration(out, client, settings.worker_prefetch)
            stats = client.stats
        if options.spark:
            spark_part(out, pool, keys)
        idle(out, runtime, driver, watcher, pool, options)
    finally:
        watcher.stop()
        runtime.stop()
        if not options.keep:
            with PoolTopology(pool, settings) as topology:
                topology.delete(force=True)
            PoolState(connect_redis(settings.connections), pool).clear()
    return PoolRun(pool, options.keep, cold, stats, runtime)
