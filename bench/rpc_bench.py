"""Keyed RPC benchmark: Switchyard's client and worker against plain pika, in one run.

Both sides use the same queue type and worker prefetch; each phase runs its own worker process
alone. Sequential (one call at a time) and pipelined (N calls in flight) phases, each for a fixed
time; prints calls/s, p50, p99 and the ratio Switchyard / plain.

    .venv/bin/python bench/rpc_bench.py                  # quorum queues, 5 s per phase
    .venv/bin/python bench/rpc_bench.py --queue-type classic --seconds 10
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.plain_pika import PlainClient  # noqa: E402
from switchyard.latency import LatencySummary  # noqa: E402
from switchyard.rpc import protocol as p  # noqa: E402
from switchyard.rpc.client import RpcClient  # noqa: E402
from switchyard.rpc.drivers import WorkerGroup  # noqa: E402
from switchyard.rpc.settings import PoolPolicy, RpcSettings  # noqa: E402
from switchyard.rpc.topology import PoolTopology  # noqa: E402


def wait_consumers(url: str, queue: str, count: int = 1, timeout: float = 20) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        deadline = time.monotonic() + timeout
        while connection.channel().queue_declare(queue, passive=True).method.consumer_count < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"no worker consuming {queue} after {timeout}s")
            time.sleep(0.05)
    finally:
        connection.close()


def switchyard_phase(
    settings: RpcSettings, pool: str, mode: str, seconds: float, in_flight: int
) -> list[float]:
    latencies: list[float] = []
    with RpcClient(pool, settings, concurrency=max(in_flight, 1), timeout=30) as client:
        client.call("k", b"warm")
        if mode == "sequential":
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                sent = time.perf_counter()
                client.call("k", b"x")
                latencies.append(time.perf_counter() - sent)
            return latencies
        # Pipelined: each completion submits the next call from its done-callback.
        deadline = time.perf_counter() + seconds
        done = threading.Event()
        outstanding = [0]
        lock = threading.Lock()

        def launch() -> None:
            sent = time.perf_counter()
            with lock:
                outstanding[0] += 1
            client.submit("k", b"x").add_done_callback(lambda f, sent=sent: finished(f, sent))

        def finished(future, sent: float) -> None:
            future.result()
            latencies.append(time.perf_counter() - sent)
            with lock:
                outstanding[0] -= 1
                last = outstanding[0] == 0
            if time.perf_counter() < deadline:
                launch()
            elif last:
                done.set()

        for _ in range(in_flight):
            launch()
        done.wait(seconds + 60)
    return latencies


def plain_phase(url: str, queue: str, mode: str, seconds: float, in_flight: int) -> list[float]:
    client = PlainClient(url, queue)
    try:
        client.publish(b"warm")
        while client.pending:
            client.connection.process_data_events(time_limit=None)
        client.latencies.clear()
        if mode == "sequential":
            client.sequential(seconds)
        else:
            client.pipelined(seconds, in_flight)
        return client.latencies
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue-type", choices=["quorum", "classic"], default="quorum")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--in-flight", type=int, default=64, help="calls in flight when pipelined")
    parser.add_argument("--prefetch", type=int, default=4, help="worker prefetch, both sides")
    args = parser.parse_args()

    os.environ.setdefault("SWITCHYARD_LOG_LEVEL", "ERROR")
    base = RpcSettings.from_env()
    policy = PoolPolicy(**{**vars(base.policy), "queue_type": p.QueueType(args.queue_type)})
    settings = RpcSettings(**{**vars(base), "policy": policy})
    url = settings.connections.amqp_url
    pool = f"bench_{uuid.uuid4().hex[:6]}"
    plain_queue = f"{pool}-plain"
    env = {**os.environ, "WORKER_PREFETCH": str(args.prefetch), "PYTHONPATH": str(ROOT)}

    print(f"RPC benchmark: {args.queue_type} queues, worker prefetch {args.prefetch}, "
          f"{args.seconds:g} s per phase, pipelined = {args.in_flight} in flight")
    results: dict[tuple[str, str], tuple[float, LatencySummary]] = {}
    with PoolTopology(pool, settings) as topology:
        topology.declare()
        topology.ensure_request_queue("k")
        connection = pika.BlockingConnection(pika.URLParameters(url))
        connection.channel().queue_declare(plain_queue, durable=True,
                                           arguments={"x-queue-type": args.queue_type})
        connection.close()
        try:
            for mode, in_flight in (("sequential", 1), ("pipelined", args.in_flight)):
                for impl in ("plain pika", "switchyard"):
                    if impl == "switchyard":
                        cmd = [sys.executable, "-m", "switchyard", "worker", "--handler",
                               "switchyard.rpc.examples:echo"]
                        worker_env = {**env, **WorkerGroup(pool, "k").environment("bench-worker")}
                        queue = p.request_queue(pool, "k")
                    else:
                        cmd = [sys.executable, str(ROOT / "bench" / "plain_pika.py"), "worker", plain_queue,
                               str(args.prefetch), url]
                        worker_env = env
                        queue = plain_queue
                    worker = subprocess.Popen(cmd, env=worker_env)
                    try:
                        wait_consumers(url, queue)
                        started = time.perf_counter()
                        if impl == "switchyard":
                            latencies = switchyard_phase(settings, pool, mode, args.seconds, in_flight)
                        else:
                            latencies = plain_phase(url, plain_queue, mode, args.seconds, in_flight)
                        elapsed = time.perf_counter() - started
                    finally:
                        worker.terminate()
                        worker.wait(20)
                    rate = len(latencies) / elapsed
                    results[(mode, impl)] = (rate, LatencySummary.of(latencies))
                    summary = results[(mode, impl)][1]
                    print(f"  {mode:10} {impl:11} {rate:9,.0f} calls/s   {summary}", flush=True)
        finally:
            topology.delete()
            connection = pika.BlockingConnection(pika.URLParameters(url))
            connection.channel().queue_delete(plain_queue)
            connection.close()

    print("\nratio switchyard / plain pika (calls/s):")
    for mode in ("sequential", "pipelined"):
        ratio = results[(mode, "switchyard")][0] / results[(mode, "plain pika")][0]
        print(f"  {mode:10} {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
