"""Keyed RPC benchmark: Switchyard's client and worker against plain pika, in one run.

Both sides use the same queue type and worker prefetch, and each has its own worker process
(both started once; the idle one waits on its socket). Load on a shared machine drifts, so the
sides alternate in short rounds (plain, Switchyard, plain, Switchyard, ...) and the ratio is
reported per round, then as the median over the rounds. Sequential (one call at a time) and
pipelined (N calls in flight) modes; only the calls are timed, not connection setup.

    .venv/bin/python bench/rpc_bench.py                  # quorum queues, 8 rounds of 2 s a side
    .venv/bin/python bench/rpc_bench.py --queue-type classic --rounds 5 --seconds 4
    .venv/bin/python bench/rpc_bench.py --busy           # a spinning process on core 1 throughout
    eval "$(scripts/rabbitmq-cluster.sh urls | sed -n 's/^SWITCHYARD_AMQP_URL=/AMQP=/p')"
    .venv/bin/python bench/rpc_bench.py --amqp-url "$AMQP" \
        --management-url http://guest:guest@127.0.0.1:15680      # on the three-node cluster

With several AMQP URLs (a cluster's nodes), each side's client and worker connect to a node taken
at random (Switchyard's ``amqp.connect``, plain pika's list in random order); the nodes the clients
landed on are printed with each mode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.plain_pika import PlainClient, connect  # noqa: E402
from bench.stats import BUSY_CORE, busy_load  # noqa: E402
from switchyard.core.latency import LatencySummary  # noqa: E402
from switchyard.rpc import protocol  # noqa: E402
from switchyard.rpc.client import RpcClient  # noqa: E402
from switchyard.rpc.control.topology import PoolTopology  # noqa: E402
from switchyard.rpc.drivers import WorkerGroup  # noqa: E402
from switchyard.rpc.settings import PoolPolicy, RpcSettings  # noqa: E402

SIDES = ("plain pika", "switchyard")
MODES = ("sequential", "pipelined")


def wait_consumers(url: str, queue: str, count: int = 1, timeout: float = 20) -> None:
    connection = connect(url)
    try:
        deadline = time.monotonic() + timeout
        while connection.channel().queue_declare(queue, passive=True).method.consumer_count < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"no worker consuming {queue} after {timeout}s")
            time.sleep(0.05)
    finally:
        connection.close()


def switchyard_round(client: RpcClient, mode: str, seconds: float, in_flight: int) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    if mode == "sequential":
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            client.call("k", b"x")
            latencies.append(time.perf_counter() - sent)
        return latencies
    # Pipelined: each completion submits the next call from its done-callback.
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


def plain_round(client: PlainClient, mode: str, seconds: float, in_flight: int) -> list[float]:
    client.latencies = []
    if mode == "sequential":
        client.sequential(seconds)
    else:
        client.pipelined(seconds, in_flight)
    return client.latencies


def timed(run: Callable[[], list[float]]) -> tuple[float, list[float]]:
    started = time.perf_counter()
    latencies = run()
    return len(latencies) / (time.perf_counter() - started), latencies


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue-type", choices=["quorum", "classic"], default="quorum")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per mode (each side once a round)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one side's turn in a round")
    parser.add_argument("--in-flight", type=int, default=64, help="calls in flight when pipelined")
    parser.add_argument("--prefetch", type=int, default=4, help="worker prefetch, both sides")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: sequential,pipelined")
    parser.add_argument("--busy", action="store_true", help=f"a spinning process pinned to core {BUSY_CORE}")
    parser.add_argument("--amqp-url", help="the broker (default SWITCHYARD_AMQP_URL); a comma-separated "
                        "list of a cluster's nodes")
    parser.add_argument("--management-url", help="its management API (default SWITCHYARD_MANAGEMENT_URL)")
    args = parser.parse_args()

    os.environ.setdefault("SWITCHYARD_LOG_LEVEL", "ERROR")
    for variable, value in (("SWITCHYARD_AMQP_URL", args.amqp_url),
                            ("SWITCHYARD_MANAGEMENT_URL", args.management_url)):
        if value:
            os.environ[variable] = value  # the workers this starts read them too
    base = RpcSettings.from_env()
    policy = PoolPolicy(**{**vars(base.policy), "queue_type": protocol.QueueType(args.queue_type)})
    settings = RpcSettings(**{**vars(base), "policy": policy})
    url = settings.connections.amqp_url
    pool = f"bench_{uuid.uuid4().hex[:6]}"
    plain_queue = f"{pool}-plain"
    env = {**os.environ, "WORKER_PREFETCH": str(args.prefetch), "PYTHONPATH": str(ROOT)}

    print(f"RPC benchmark (pool {pool}): {args.queue_type} queues, worker prefetch {args.prefetch}, "
          f"{args.rounds} rounds of {args.seconds:g} s a side, pipelined = {args.in_flight} in flight, "
          f"{f'busy (a spinner on core {BUSY_CORE})' if args.busy else 'no spinner'}; {load()}",
          flush=True)
    spinner = busy_load(args.busy)
    try:
        summary = run_all(args, settings, pool, url, plain_queue, env)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    print(f"\nmedian ratio switchyard / plain pika (calls/s), {load()}:")
    for mode, ratio in summary.items():
        print(f"  {mode:10} {ratio:.2f}")
    return 0


def run_all(args: argparse.Namespace, settings: RpcSettings, pool: str, url: str, plain_queue: str,
            env: dict[str, str]) -> dict[str, float]:
    """Both workers up, every mode's rounds, everything removed again."""
    with PoolTopology(pool, settings) as topology:  # closed during the run: idle, it would miss heartbeats
        topology.declare()
        topology.ensure_request_queue("k")
    connection = connect(url)
    connection.channel().queue_declare(plain_queue, durable=True, arguments={"x-queue-type": args.queue_type})
    connection.close()
    workers = [
        subprocess.Popen([sys.executable, str(ROOT / "bench" / "plain_pika.py"), "worker", plain_queue,
                          str(args.prefetch), url], env=env),
        subprocess.Popen([sys.executable, "-m", "switchyard", "worker", "--handler",
                          "switchyard.rpc.examples:echo"],
                         env={**env, **WorkerGroup(pool, "k").environment("bench-worker")}),
    ]
    try:
        wait_consumers(url, plain_queue)
        wait_consumers(url, protocol.request_queue(pool, "k"))
        summary = {mode: run_mode(mode, args, settings, pool, url, plain_queue)
                   for mode in args.modes.split(",")}
    finally:
        clean_up(workers, settings, pool, url, plain_queue)
    return summary


def clean_up(workers: list[subprocess.Popen], settings: RpcSettings, pool: str, url: str, queue: str) -> None:
    """Stop the run's workers, delete its pool and the baseline's queue (both benches' ``finally``)."""
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.wait(20)
    with PoolTopology(pool, settings) as topology:
        topology.delete(force=True)
    connection = connect(url)
    connection.channel().queue_delete(queue)
    connection.close()


def run_mode(mode: str, args: argparse.Namespace, settings: RpcSettings, pool: str, url: str,
             plain_queue: str) -> float:
    in_flight = 1 if mode == "sequential" else args.in_flight
    plain = PlainClient(url, plain_queue)
    ours = RpcClient(pool, settings, concurrency=in_flight, timeout=30)
    try:
        plain.publish(b"warm")
        while plain.pending:
            plain.connection.process_data_events(time_limit=None)
        ours.call("k", b"warm")
        print(f"\n{mode}: clients on port {plain.connection._impl.params.port} (plain pika), "
              f"{ours._core._connection._impl.params.port} (switchyard)", flush=True)
        ratios: list[float] = []
        latencies: dict[str, list[float]] = {side: [] for side in SIDES}
        for n in range(1, args.rounds + 1):
            plain_rate, plain_lat = timed(lambda: plain_round(plain, mode, args.seconds, in_flight))
            our_rate, our_lat = timed(lambda: switchyard_round(ours, mode, args.seconds, in_flight))
            latencies["plain pika"] += plain_lat
            latencies["switchyard"] += our_lat
            ratios.append(our_rate / plain_rate)
            print(f"  round {n}: plain pika {plain_rate:8,.0f}/s   switchyard {our_rate:8,.0f}/s   "
                  f"ratio {ratios[-1]:.2f}   ({os.getloadavg()[0]:.2f})", flush=True)
        for side in SIDES:
            print(f"  {side:11} {LatencySummary.of(latencies[side])}")
        median = statistics.median(ratios)
        print(f"  median ratio {median:.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}); {load()}",
              flush=True)
        return median
    finally:
        ours.close()
        plain.close()


if __name__ == "__main__":
    raise SystemExit(main())
