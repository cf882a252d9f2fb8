"""``switchyard demo``: the main job on the local stack, with a summary a person can read.

A fresh pool with its control plane running locally (the Lambda handlers behind RabbitMQ
event-source bridges, the reconciler ticking, workers as subprocesses). Calls go to keys that
have no workers; groups start by themselves, traffic flows, a handler error comes back as a
negative response, a request stuck behind a slow worker comes back ``expired``, and once idle the
groups unbind and stop. Everything it created is deleted at the end (unless ``--keep``).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import Future

from switchyard.latency import LatencySummary

KEYS = ("infra=42", "infra=7", "🚂 express", "timetable #12", "infra=99", "infra=3")


class Printer:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def section(self, title: str) -> None:
        print(f"\n{title}", flush=True)

    def line(self, text: str) -> None:
        print(f"  {text}", flush=True)


class StateWatcher:
    """Records each group's transitions (active, unbound, running, stopped) as they happen."""

    def __init__(self, runtime, pool: str) -> None:
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


def _pipelined(client, keys: list[str], seconds: float, concurrency: int):
    """Keep ``concurrency`` calls in flight over ``keys`` for ``seconds``; returns per-call results."""
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
        future.add_done_callback(lambda f, key=key, sent=sent: finish(f, key, sent))

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


def run_demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    from switchyard.observability import logger

    if not args.verbose:
        logger.setLevel("ERROR")
    import redis

    from switchyard.local.rpc_runtime import LocalControlPlane
    from switchyard.rpc.amqp import redact
    from switchyard.rpc.client import RpcClient
    from switchyard.rpc.control_plane import ControlSettings
    from switchyard.rpc.drivers import SubprocessDriver
    from switchyard.rpc.reconciler import Delays
    from switchyard.rpc.settings import RpcSettings
    from switchyard.rpc.state import PoolState
    from switchyard.rpc.topology import PoolTopology

    out = Printer()
    settings = RpcSettings.from_env()
    pool = args.pool or f"demo_{uuid.uuid4().hex[:6]}"
    keys = list(KEYS[: max(1, min(args.keys, len(KEYS)))])
    control = ControlSettings(pool, Delays(unbind_s=args.unbind_delay, stop_s=args.stop_delay),
                              reconcile_interval_s=0.5)
    driver = SubprocessDriver(
        (sys.executable, "-m", "switchyard", "worker", "--handler", "switchyard.rpc.examples:demo"),
        min_workers=1, max_workers=2, stop_timeout=5,
        env={"SLEEPY_SECONDS": "1", "SWITCHYARD_LOG_LEVEL": "ERROR"},
    )
    print("Switchyard demo: keyed RPC over RabbitMQ with self-managing worker groups")
    out.line(f"pool {pool} on {redact(settings.connections.amqp_url)} "
             f"({settings.policy.queue_type.value} request queues), pool state in Redis")
    out.line(f"control plane: local runtime running the Lambda handlers; workers as subprocesses; "
             f"unbind after {args.unbind_delay:g} s idle, stop after {args.stop_delay:g} s unbound")

    runtime = LocalControlPlane(control, settings, driver).start()
    watcher = StateWatcher(runtime, pool).start()
    cold: dict[str, float] = {}
    try:
        with RpcClient(pool, settings, concurrency=args.concurrency, timeout=15) as client:
            out.section(f"1. Cold start: calling {len(keys)} keys that have no workers yet")
            started = {key: time.perf_counter() for key in keys}
            futures = {key: client.submit(key, "hello") for key in keys}
            for key, future in futures.items():
                response = future.result(30)
                cold[key] = time.perf_counter() - started[key]
                out.line(f"{key!r:18} {response.status:6} first response after {cold[key] * 1000:6.0f} ms"
                         f"  <- {response.text()[:60]}")

            out.section(f"2. Traffic: {args.seconds:g} s with {args.concurrency} calls in flight over "
                        f"{len(keys)} keys")
            t0 = time.perf_counter()
            latencies, statuses, failures = _pipelined(client, keys, args.seconds, args.concurrency)
            wall = time.perf_counter() - t0
            everything = [x for values in latencies.values() for x in values]
            total = sum(statuses.values()) + sum(failures.values())
            out.line(f"{total:,} calls in {wall:.1f} s = {total / wall:,.0f} calls/s; "
                     f"{LatencySummary.of(everything)}")
            out.line("statuses: " + ", ".join(f"{s} {n:,}" for s, n in statuses.most_common())
                     + (f"; failures: {dict(failures)}" if failures else "; no failures"))
            for key in keys:
                out.line(f"  {key!r:18} {len(latencies[key]):6,} calls, {LatencySummary.of(latencies[key])}")

            out.section("3. Negative responses: the handler's error comes back at once, no timeout")
            client.call("math", "6/3")  # cold start of 'math', not timed
            for body in ("6/3", "1/0", "oops"):
                response = client.call("math", body)
                out.line(f"math {body!r:7} -> {response.status:5} {response.text()[:70]}")

            prefetch = settings.worker_prefetch
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
            stats = client.stats

        out.section(f"5. Idle: groups unbind after {args.unbind_delay:g} s, stop {args.stop_delay:g} s later")
        idle_from = time.monotonic()
        deadline = idle_from + args.unbind_delay + args.stop_delay + 20
        while time.monotonic() < deadline and (runtime.plane.state.groups() or driver.list_running(pool)):
            time.sleep(0.2)
        for at, key, status in watcher.events:
            if at >= idle_from:
                out.line(f"+{at - idle_from:5.1f} s  {key!r:18} {status}")
        left = runtime.plane.state.groups()
        out.line("all groups stopped and their queues deleted" if not left and not driver.list_running(pool)
                 else f"still up after the wait: {sorted(left)}")
    finally:
        watcher.stop()
        runtime.stop()
        if not args.keep:
            with PoolTopology(pool, settings) as topology:
                topology.delete()
            PoolState(redis.Redis.from_url(settings.connections.redis_url), pool).clear()

    out.section("Summary")
    cold_summary = LatencySummary.of(list(cold.values()))
    out.line(f"cold start (first response for a new key, {len(cold)} keys at once): "
             f"p50 {cold_summary.p50_ms:.0f} ms, max {cold_summary.max_ms:.0f} ms")
    out.line(f"client: {stats.published:,} requests, {stats.responses:,} responses, "
             f"{stats.timeouts} timeouts, {stats.stale_responses} late responses ignored")
    out.line(f"control plane: {runtime.reconcile_passes} reconciler passes; bridges: "
             + ", ".join(f"{s.function_name.split('-')[0]} {s.stats.invocations} invocations"
                         for s in runtime.sources))
    out.line("pool deleted" if not args.keep else f"pool kept: switchyard pool status --pool {pool}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="run the local stack with demo traffic and print what happened")
    demo.add_argument("--seconds", type=float, default=5.0, help="length of the traffic phase")
    demo.add_argument("--keys", type=int, default=4, help=f"keys to call (1-{len(KEYS)})")
    demo.add_argument("--concurrency", type=int, default=32, help="calls in flight during the traffic phase")
    demo.add_argument("--unbind-delay", type=float, default=3.0, help="seconds idle before a group unbinds")
    demo.add_argument("--stop-delay", type=float, default=3.0, help="seconds unbound before a group stops")
    demo.add_argument("--pool", help="pool name (default: a fresh demo_<6 hex digits>)")
    demo.add_argument("--keep", action="store_true", help="keep the pool afterwards")
    demo.add_argument("--verbose", action="store_true", help="show the structured logs too")
    demo.set_defaults(func=run_demo)
