"""Asyncio RPC benchmark: Switchyard's ``AsyncRpcClient`` and worker against aio-pika's own RPC
pattern (``aio_pika.patterns.RPC``: its client and its worker), in one run and one event loop.

A third side isolates the client: aio-pika's RPC tutorial client (futures by correlation id, its
callback queue RabbitMQ's direct reply-to) calling the same Switchyard worker through the pool's
exchange. Each worker is its own process with the same prefetch and queue type (started once). As in
``rpc_bench.py`` the sides take turns in short rounds and the ratio of Switchyard's rate to each
baseline is reported per round, then as the median. Sequential (one coroutine calling, one call at a
time) and concurrent (N coroutines, one call each in flight) modes; only the calls are timed. Not the
same work: aio-pika's pattern pickles its payload and publishes non-persistent messages by default;
Switchyard's requests (and the tutorial client's here) are persistent and routed by key.

    .venv/bin/python bench/async_rpc_bench.py                    # quorum queues, 8 rounds of 2 s a side
    .venv/bin/python bench/async_rpc_bench.py --queue-type classic --rounds 5 --seconds 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aio_pika  # noqa: E402
from aio_pika.patterns import RPC  # noqa: E402

from bench.plain_pika import connect  # noqa: E402
from bench.rpc_bench import clean_up, load, wait_consumers  # noqa: E402
from switchyard.core.latency import LatencySummary  # noqa: E402
from switchyard.rpc import AsyncRpcClient, protocol  # noqa: E402
from switchyard.rpc.control.topology import PoolTopology  # noqa: E402
from switchyard.rpc.drivers import WorkerGroup  # noqa: E402
from switchyard.rpc.settings import PoolPolicy, RpcSettings  # noqa: E402

SIDES = ("aio-pika RPC", "aio-pika client", "switchyard")
BASELINES = SIDES[:-1]  # Switchyard's rate is divided by each
MODES = ("sequential", "concurrent")


def queue_arguments(queue_type: str) -> dict[str, object]:
    """aio-pika's ``register`` passes these to ``queue_declare``: the same queue type as the pool's."""
    return {"durable": True, "arguments": {"x-queue-type": queue_type}}


async def echo(*, body: bytes) -> bytes:
    return body


async def aio_worker(url: str, method: str, prefetch: int, queue_type: str) -> None:
    """aio-pika's RPC worker, as its documentation writes it, with the benchmark's prefetch."""
    connection = await aio_pika.connect_robust(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        rpc = await RPC.create(channel)
        await rpc.register(method, echo, **queue_arguments(queue_type))
        await asyncio.Future()  # until terminated


async def run_side(call: Callable[[], Awaitable[object]], seconds: float,
                   callers: int) -> tuple[float, list[float]]:
    """``callers`` coroutines calling one after another until the turn ends; (calls/s, latencies)."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - sent)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return len(latencies) / (time.perf_counter() - started), latencies


class TutorialClient:
    """aio-pika's RPC tutorial client (a callback queue, futures by correlation id), calling
    the Switchyard worker through the pool's exchange: the client's cost alone, the worker the same."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel, pool: str, key: str) -> None:
        self.channel, self.pool, self.key = channel, pool, key
        self.futures: dict[str, asyncio.Future[bytes]] = {}

    async def open(self) -> TutorialClient:
        # Direct reply-to: aio-pika names its exclusive queues itself ("amq_*"), and a Switchyard worker
        # answers no queue a caller named (only "amq.gen-*", direct reply-to, durable reply queues).
        self.callback_queue = await self.channel.get_queue(protocol.DIRECT_REPLY_TO, ensure=False)
        await self.callback_queue.consume(self.on_response, no_ack=True)
        self.exchange = await self.channel.get_exchange(protocol.req_exchange(self.pool), ensure=False)
        return self

    async def on_response(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        future = self.futures.pop(message.correlation_id or "", None)
        if future is not None:
            future.set_result(message.body)

    async def call(self, body: bytes) -> bytes:
        correlation_id = uuid.uuid4().hex
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.futures[correlation_id] = future
        await self.exchange.publish(
            aio_pika.Message(body, correlation_id=correlation_id, reply_to=self.callback_queue.name,
                             headers={protocol.KEY_HEADER: self.key},
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=protocol.routing_key(self.key))
        return await future


async def run_mode(mode: str, args: argparse.Namespace, settings: RpcSettings, pool: str, url: str,
                   method: str) -> dict[str, float]:
    """Every round, each side in turn; returns the median ratio of Switchyard to each other side."""
    callers = 1 if mode == "sequential" else args.in_flight
    connection = await aio_pika.connect_robust(url)
    try:
        rpc = await RPC.create(await connection.channel())
        tutorial = await TutorialClient(await connection.channel(), pool, "k").open()
        async with AsyncRpcClient(pool, settings, concurrency=callers, timeout=30) as ours:

            async def aio_call() -> object:
                return await rpc.call(method, kwargs={"body": b"x"})

            async def tutorial_call() -> object:
                return await tutorial.call(b"x")

            async def our_call() -> object:
                return await ours.call("k", b"x")

            calls = dict(zip(SIDES, (aio_call, tutorial_call, our_call), strict=True))
            for call in calls.values():
                await call()
            print(f"\n{mode}: {callers} caller{'s' if callers > 1 else ''}", flush=True)
            ratios: dict[str, list[float]] = {side: [] for side in BASELINES}
            latencies: dict[str, list[float]] = {side: [] for side in SIDES}
            for n in range(1, args.rounds + 1):
                rates = {}
                for side, call in calls.items():
                    rates[side], lat = await run_side(call, args.seconds, callers)
                    latencies[side] += lat
                for side in BASELINES:
                    ratios[side].append(rates[SIDES[-1]] / rates[side])
                print(f"  round {n}: " + "   ".join(f"{side} {rate:7,.0f}/s" for side, rate in rates.items())
                      + f"   ({os.getloadavg()[0]:.2f})", flush=True)
            for side in SIDES:
                print(f"  {side:16} {LatencySummary.of(latencies[side])}")
            medians = {side: statistics.median(r) for side, r in ratios.items()}
            for side, r in ratios.items():
                print(f"  median ratio to {side}: {medians[side]:.2f} (min {min(r):.2f}, max {max(r):.2f})")
            print(f"  {load()}", flush=True)
            await rpc.close()
            return medians
    finally:
        await connection.close()


def run_all(args: argparse.Namespace, settings: RpcSettings, pool: str,
            url: str) -> dict[str, dict[str, float]]:
    """Both workers up, every mode's rounds, everything removed again."""
    method = f"{pool}-aio"
    with PoolTopology(pool, settings) as topology:
        topology.declare()
        topology.ensure_request_queue("k")
    connection = connect(url)  # as aio-pika's register declares it, so its consumer can be waited for
    connection.channel().queue_declare(method, durable=True, arguments={
        "x-queue-type": args.queue_type, "x-dead-letter-exchange": RPC.DLX_NAME})
    connection.close()
    env = {**os.environ, "WORKER_PREFETCH": str(args.prefetch), "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen([sys.executable, str(Path(__file__)), "aio-worker", method, str(args.prefetch),
                          args.queue_type, url], env=env),
        subprocess.Popen([sys.executable, "-m", "switchyard", "worker", "--handler",
                          "switchyard.rpc.examples:echo"],
                         env={**env, **WorkerGroup(pool, "k").environment("bench-worker")}),
    ]
    try:
        wait_consumers(url, method)
        wait_consumers(url, protocol.request_queue(pool, "k"))
        return {mode: asyncio.run(run_mode(mode, args, settings, pool, url, method))
                for mode in args.modes.split(",")}
    finally:
        clean_up(workers, settings, pool, url, method)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "aio-worker":
        method, prefetch, queue_type, url = sys.argv[2:6]
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(aio_worker(url, method, int(prefetch), queue_type))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue-type", choices=["quorum", "classic"], default="quorum")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per mode (each side once a round)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one side's turn in a round")
    parser.add_argument("--in-flight", type=int, default=64, help="calling coroutines when concurrent")
    parser.add_argument("--prefetch", type=int, default=4, help="worker prefetch, both sides")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: sequential,concurrent")
    parser.add_argument("--amqp-url", help="the broker (default SWITCHYARD_AMQP_URL; with a list of a "
                        "cluster's nodes, aio-pika takes the first)")
    args = parser.parse_args()

    os.environ.setdefault("SWITCHYARD_LOG_LEVEL", "ERROR")
    if args.amqp_url:
        os.environ["SWITCHYARD_AMQP_URL"] = args.amqp_url  # the worker this starts reads it too
    base = RpcSettings.from_env()
    policy = PoolPolicy(**{**vars(base.policy), "queue_type": protocol.QueueType(args.queue_type)})
    settings = RpcSettings(**{**vars(base), "policy": policy})
    url = settings.connections.amqp_url.split(",")[0].strip()
    pool = f"bench_{uuid.uuid4().hex[:6]}"
    print(f"asyncio RPC benchmark (pool {pool}): {args.queue_type} queues, worker prefetch "
          f"{args.prefetch}, {args.rounds} rounds of {args.seconds:g} s a side, concurrent = "
          f"{args.in_flight} callers; {load()}", flush=True)
    summary = run_all(args, settings, pool, url)
    for side, what in zip(BASELINES, ("aio-pika RPC", "aio-pika client, the same worker"), strict=True):
        print(f"\nmedian ratio switchyard / {what} (calls/s), {load()}:")
        for mode, medians in summary.items():
            print(f"  {mode:10} {medians[side]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
