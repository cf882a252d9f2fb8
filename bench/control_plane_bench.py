"""RPC control plane benchmark: cold start, orphan forwarding rate, dead-letter responder rate.

- cold start: first response for a new key, one key after another, through the local runtime
  (orphan bridge -> orphan handler -> subprocess driver -> worker start -> response);
- orphan handler: one Lambda invocation with a batch of orphans (the exact aws:rmq event) over
  new keys and over keys whose queues exist, against the raw ceiling measured in the same run:
  the same number of confirmed publishes to the request exchange, nothing else;
- dead-letter responder: one invocation with a batch of dead letters, each answered.

    .venv/bin/python bench/control_plane_bench.py [--cold-keys 20] [--batch 1000] [--keys 100]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
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
from switchyard.rpc.drivers import NoopDriver  # noqa: E402
from switchyard.rpc.service import ControlPlane  # noqa: E402
from switchyard.rpc.settings import ControlSettings, Delays, RpcSettings  # noqa: E402


def new_pool(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:6]}"


def cleanup(settings: RpcSettings, pool: str, plane: ControlPlane | None = None) -> None:
    with PoolTopology(pool, settings) as topology:
        topology.delete(force=True)
    if plane is not None:
        plane.state.clear()


def first_calls(pool: str, settings: RpcSettings, keys: int, timeout: float) -> list[float]:
    """Seconds to the first response of each new key ``cold-0`` .. ``cold-{keys-1}``, one after another."""
    samples = []
    with RpcClient(pool, settings, timeout=timeout) as client:
        for i in range(keys):
            started = time.perf_counter()
            client.call(f"cold-{i}", b"hello")
            samples.append(time.perf_counter() - started)
    return samples


def bench_cold_start(settings: RpcSettings, keys: int) -> LatencySummary:
    pool = new_pool("bcold")
    control = ControlSettings(pool, Delays(unbind_s=600, stop_s=600), reconcile_interval_s=1.0)
    runtime = LocalControlPlane(control, settings).start()
    try:
        samples = first_calls(pool, settings, keys, timeout=30)
    finally:
        runtime.stop()
        cleanup(settings, pool, runtime.plane)
    return LatencySummary.of(samples)


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
    parser.add_argument("--cold-keys", type=int, default=20, help="new keys for the cold-start phase")
    parser.add_argument("--batch", type=int, default=1000, help="messages per handler invocation")
    parser.add_argument("--keys", type=int, default=100, help="distinct keys in the orphan batch")
    args = parser.parse_args()
    settings = RpcSettings.from_env()

    print(f"control plane benchmark ({settings.policy.queue_type.value} request queues)")
    print(f"\ncold start, {args.cold_keys} new keys one after another (subprocess driver):")
    cold = bench_cold_start(settings, args.cold_keys)
    print(f"  first response: p50 {cold.p50_ms:.0f} ms, p99 {cold.p99_ms:.0f} ms, max {cold.max_ms:.0f} ms "
          f"(aim: p50 < 1000 ms)")
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
