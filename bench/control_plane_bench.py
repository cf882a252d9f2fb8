"""RPC control plane benchmark: cold start, orphan forwarding rate, dead-letter responder rate.

- cold start: first response for a new key through the local runtime (orphan bridge -> orphan
  handler -> subprocess driver -> worker start, or a warm spare's adoption -> response): one key
  after another and ``--burst`` new keys at once, each without spares and with them
  (``minSpares``: 1 one at a time, each key called once a spare waits; ``--burst`` for the burst,
  all waiting before it). A call a spare did not answer (none was ready) is counted apart;
- orphan handler: one Lambda invocation with a batch of orphans (the exact aws:rmq event) over
  new keys and over keys whose queues exist, against the raw ceiling measured in the same run:
  the same number of confirmed publishes to the request exchange, nothing else;
- dead-letter responder: one invocation with a batch of dead letters, each answered.

    .venv/bin/python bench/control_plane_bench.py [--cold-keys 20] [--burst 50] [--batch 1000] [--keys 100]
        [--cold-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.stats import quiet_environment  # noqa: E402
from switchyard.aws import services  # noqa: E402
from switchyard.core.latency import LatencySummary  # noqa: E402
from switchyard.local.functions import load_function  # noqa: E402
from switchyard.local.lambda_context import FakeLambdaContext  # noqa: E402
from switchyard.local.rmq_bridge import RmqDelivery, build_rmq_event  # noqa: E402
from switchyard.local.rpc_runtime import LocalControlPlane  # noqa: E402
from switchyard.rpc import protocol  # noqa: E402
from switchyard.rpc.client import RpcClient  # noqa: E402
from switchyard.rpc.control.publisher import ConfirmingPublisher, Outgoing  # noqa: E402
from switchyard.rpc.control.topology import PoolTopology  # noqa: E402
from switchyard.rpc.drivers import NoopDriver, driver_from_env  # noqa: E402
from switchyard.rpc.service import ControlPlane  # noqa: E402
from switchyard.rpc.settings import (  # noqa: E402
    DEMO_HANDLER,
    ControlSettings,
    Delays,
    DriverSettings,
    RpcSettings,
)
from switchyard.rpc.spares import SpareRegistry  # noqa: E402


def new_pool(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:6]}"


def cleanup(settings: RpcSettings, pool: str, plane: ControlPlane | None = None) -> None:
    with PoolTopology(pool, settings) as topology:
        topology.delete(force=True)
    if plane is not None:
        plane.state.clear()


SPARE_MARK = "-spare-"  # in the worker id (``x-worker-id``) of a worker that started as a spare


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark: {what} not within {timeout:g} s")
        time.sleep(0.01)


def first_calls(client: RpcClient, keys: list[str],
                ready: Callable[[], None] | None = None) -> list[tuple[float, bool]]:
    """(seconds to the first response, answered by a spare) of each new key, one after another;
    ``ready`` runs before each call, off the clock (with spares: until one waits)."""
    samples = []
    for key in keys:
        if ready is not None:
            ready()
        started = time.perf_counter()
        response = client.call(key, b"hello").raise_for_status()
        samples.append((time.perf_counter() - started, SPARE_MARK in str(response.headers.get(
            protocol.WORKER_ID_HEADER, ""))))
    return samples


def burst_calls(client: RpcClient, keys: list[str]) -> list[tuple[float, bool]]:
    """The same for ``keys`` all sent at once: each from the burst's start to its own response."""
    started = time.perf_counter()
    done: dict[str, float] = {}
    futures = {}
    for key in keys:
        future = client.submit(key, b"hello")
        future.add_done_callback(lambda _f, key=key: done.__setitem__(key, time.perf_counter()))
        futures[key] = future
    answers = {key: future.result().raise_for_status() for key, future in futures.items()}
    return [(done[key] - started, SPARE_MARK in str(answers[key].headers.get(protocol.WORKER_ID_HEADER, "")))
            for key in keys]


@dataclasses.dataclass
class ColdRun:
    label: str
    summary: LatencySummary
    by_spares: int
    calls: int


def bench_cold_start(settings: RpcSettings, keys: int, spares: int = 0, burst: bool = False) -> ColdRun:
    """First responses of ``keys`` new keys on a pool keeping ``spares`` spares (one after another,
    or all at once with ``burst``)."""
    pool = new_pool("bcold")
    control = ControlSettings(pool, Delays(unbind_s=600, stop_s=600), reconcile_interval_s=1.0)
    driver_settings = dataclasses.replace(DriverSettings.from_env(default_handler=DEMO_HANDLER),
                                          min_spares=spares, max_workers=1)
    runtime = LocalControlPlane(control, settings, driver=driver_from_env(driver_settings, pool)).start()
    registry = getattr(runtime.driver, "spares", None)
    names = [f"cold-{i}" for i in range(keys)]

    def spare_ready(count: int = 1) -> None:
        if isinstance(registry, SpareRegistry):
            wait_until(lambda: len(registry.waiting()) >= count, 120, f"{count} spares waiting")

    try:
        with RpcClient(pool, settings, timeout=60) as client:
            if burst:
                spare_ready(spares)
                samples = burst_calls(client, names)
            else:
                samples = first_calls(client, names, spare_ready)
    finally:
        runtime.stop()
        cleanup(settings, pool, runtime.plane)
    how = f"{keys} new keys at once" if burst else f"{keys} new keys one after another"
    return ColdRun(f"{how}, {spares} spares" if spares else f"{how}, no spares",
                   LatencySummary.of([s for s, _ in samples]), sum(b for _, b in samples), len(samples))


def request_props(key: str, n: int, reply_to: str) -> pika.BasicProperties:
    return pika.BasicProperties(correlation_id=f"bench.{n}", reply_to=reply_to, expiration="60000",
                                message_id=f"m{n}", delivery_mode=2, headers={protocol.KEY_HEADER: key})


def bench_orphans(settings: RpcSettings, batch: int, keys: int) -> dict[str, float]:
    pool = new_pool("borph")
    plane = ControlPlane(ControlSettings(pool, Delays()), settings, driver=NoopDriver())
    services.control_plane.install(plane)
    handler = load_function("rpc_orphans").lambda_handler
    rates: dict[str, float] = {}
    try:
        with PoolTopology(pool, settings) as topology:
            topology.declare()
        vhost = pika.URLParameters(settings.connections.amqp_url).virtual_host
        for label in ("new keys", "existing queues"):
            deliveries = [RmqDelivery(b"x" * 100, request_props(f"key-{n % keys}", n, "bench-replies"))
                          for n in range(batch)]
            event = build_rmq_event(protocol.orphan_queue(pool), vhost, deliveries)
            started = time.perf_counter()
            outcome = handler(event, FakeLambdaContext("rpc_orphans", 60_000))
            elapsed = time.perf_counter() - started
            assert outcome["forwarded"] == batch, outcome
            rates[f"orphan handler, {batch} orphans over {keys} {label}"] = batch / elapsed
        # The ceiling in the same run: the same confirmed publishes, no parsing, locks or declares.
        publisher = ConfirmingPublisher(settings.connections.amqp_url, "bench-raw")
        publisher.publish_all([Outgoing("", "bench-nowhere", b"warm", pika.BasicProperties())])  # connected
        outgoing = [Outgoing(protocol.req_exchange(pool), protocol.routing_key(f"key-{n % keys}"), b"x" * 100,
                             request_props(f"key-{n % keys}", n, "bench-replies"), mandatory=True)
                    for n in range(batch)]
        started = time.perf_counter()
        publisher.publish_all(outgoing)
        rates[f"raw confirmed publishes ({batch}), the ceiling"] = batch / (time.perf_counter() - started)
        publisher.close()
    finally:
        services.control_plane.install(None)
        plane.close()
        cleanup(settings, pool, plane)
    return rates


def bench_dead_letters(settings: RpcSettings, batch: int) -> float:
    pool = new_pool("bdl")
    plane = ControlPlane(ControlSettings(pool, Delays()), settings, driver=NoopDriver())
    services.control_plane.install(plane)
    handler = load_function("rpc_dead_letters").lambda_handler
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    try:
        with PoolTopology(pool, settings) as topology:
            topology.declare()
        reply_queue = connection.channel().queue_declare("", exclusive=True).method.queue
        deliveries = []
        for n in range(batch):
            props = request_props("k", n, reply_queue)
            props.headers = {**props.headers, protocol.FIRST_DEATH_REASON_HEADER: "expired",
                             "x-first-death-queue": protocol.request_queue(pool, "k")}
            deliveries.append(RmqDelivery(b"x" * 100, props))
        vhost = pika.URLParameters(settings.connections.amqp_url).virtual_host
        event = build_rmq_event(protocol.dl_queue(pool), vhost, deliveries)
        started = time.perf_counter()
        outcome = handler(event, FakeLambdaContext("rpc_dead_letters", 60_000))
        elapsed = time.perf_counter() - started
        assert outcome["responses"] == batch, outcome
        answered = connection.channel().queue_declare(reply_queue, passive=True).method.message_count
        assert answered == batch, answered
        return batch / elapsed
    finally:
        connection.close()
        services.control_plane.install(None)
        plane.close()
        cleanup(settings, pool, plane)


def main() -> int:
    quiet_environment()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-keys", type=int, default=20,
                        help="new keys called one after another in the cold-start phase")
    parser.add_argument("--burst", type=int, default=50,
                        help="new keys called at once in the cold-start phase (and spares for it)")
    parser.add_argument("--cold-only", action="store_true", help="run the cold-start phase only")
    parser.add_argument("--batch", type=int, default=1000, help="messages per handler invocation")
    parser.add_argument("--keys", type=int, default=100, help="distinct keys in the orphan batch")
    args = parser.parse_args()
    settings = RpcSettings.from_env()

    print(f"control plane benchmark ({settings.policy.queue_type.value} request queues)")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\ncold start, first response of a new key (subprocess driver; aim: p50 < 400 ms without spares, "
          "< 100 ms with one):")
    for keys, spares, burst in ((args.cold_keys, 0, False), (args.cold_keys, 1, False),
                                (args.burst, 0, True), (args.burst, args.burst, True)):
        run = bench_cold_start(settings, keys, spares, burst)
        c = run.summary
        print(f"  {run.label:44} p50 {c.p50_ms:5.0f} ms  p99 {c.p99_ms:5.0f} ms  max {c.max_ms:5.0f} ms"
              f"  (by a spare: {run.by_spares}/{run.calls})")
    if args.cold_only:
        return 0
    print(f"\norphan handler, one invocation of {args.batch}:")
    rates = bench_orphans(settings, args.batch, args.keys)
    ceiling = next(v for k, v in rates.items() if "ceiling" in k)
    for label, rate in rates.items():
        print(f"  {label:58} {rate:9,.0f} msg/s  ({rate / ceiling:.2f} of the ceiling)")
    print("  (aim: >= 5,000 msg/s)")
    print(f"\ndead-letter responder, one invocation of {args.batch}:")
    print(f"  {bench_dead_letters(settings, args.batch):,.0f} dead letters answered per second")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
