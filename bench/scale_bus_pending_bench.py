"""How the event bus grows with subscribers and the pending queue with endpoints.

Both on the shared Redis under names of their own (a bus named ``scale<hex>``, a pending prefix
``scale<hex>``), every key removed at the end. Memory is the sum of ``MEMORY USAGE`` over the run's
own keys (the server's ``used_memory`` moves with everyone else's work).

- bus, at each count of subscribers on one topic (``--subscribers 10 100 1000``): memory per
  subscriber with nothing queued and with 10 events queued each; the ingest of one event (fanned out
  to every subscriber); one housekeeping pass (``housekeep``: promote, scrub, autodrop, telemetry);
- pending, at each count of endpoints (``--endpoints 100 1000 10000``), one waiting request each:
  memory per endpoint, enqueue time, and the node's housekeeping (the data-loss guard, which is one
  command whatever the endpoints: nothing in a node's periodic work walks the endpoints).

    .venv/bin/python bench/scale_bus_pending_bench.py [--subscribers ...] [--endpoints ...] [--busy]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale_bench import busy_load  # noqa: E402
from bench.stats import load_average, quiet_environment  # noqa: E402
from switchyard.bus.housekeeping import housekeep  # noqa: E402
from switchyard.bus.settings import BusSettings  # noqa: E402
from switchyard.bus.store import BusStore, event_json  # noqa: E402
from switchyard.core.redis_client import connect_redis  # noqa: E402
from switchyard.pending.settings import PendingSettings  # noqa: E402
from switchyard.pending.store import RedisStore  # noqa: E402

TOPIC = "scale-topic"


def memory_of(client: Any, pattern: str) -> tuple[int, int]:
    """(bytes, keys) of every key matching ``pattern``."""
    total = keys = 0
    for key in client.scan_iter(match=pattern, count=1000):
        total += client.memory_usage(key, samples=0) or 0
        keys += 1
    return total, keys


def drop(client: Any, pattern: str) -> None:
    batch = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            client.unlink(*batch)
            batch = []
    if batch:
        client.unlink(*batch)


def timed_ms(operation: Any, *args: Any) -> float:
    started = time.perf_counter()
    operation(*args)
    return (time.perf_counter() - started) * 1000


def bench_bus(client: Any, count: int) -> dict[str, Any]:
    settings = BusSettings(name=f"scale{uuid.uuid4().hex[:6]}")
    store = BusStore(client, settings)
    pattern = settings.key_prefix + "*"
    row: dict[str, Any] = {"subscribers": count, "load_before": load_average()}
    try:
        publisher = store.create_token("scale-publisher")
        for n in range(count):
            token = store.create_token(f"scale-sub-{n}")
            store.subscribe(token, [TOPIC], f"https://example.com/cb/{n}", str(uuid.uuid4()), 100, 500)
        store.publish(TOPIC, publisher, event_json(TOPIC, "warm", "https://example.com/e/0", 0, None))
        empty, _ = memory_of(client, pattern)
        publish_ms = [timed_ms(store.publish, TOPIC, publisher,
                               event_json(TOPIC, "update", f"https://example.com/e/{i}", i, {"n": i}))
                      for i in range(10)]
        queued, keys = memory_of(client, pattern)
        row.update(bytes_per_subscriber=empty / count, bytes_per_subscriber_10_queued=queued / count,
                   keys=keys, publish_ms=statistics.median(publish_ms),
                   housekeeping_ms=statistics.median(timed_ms(housekeep, store) for _ in range(3)),
                   load_after=load_average())
    finally:
        drop(client, pattern)
    return row


def bench_pending(count: int) -> dict[str, Any]:
    settings = PendingSettings(prefix=f"scale{uuid.uuid4().hex[:6]}")
    closed = threading.Event()
    store = RedisStore(settings, uuid.uuid4().hex, closed)
    client = store.client
    row: dict[str, Any] = {"endpoints": count, "load_before": load_average()}
    try:
        started = time.perf_counter()
        for n in range(count):
            request_id = uuid.uuid4().hex
            element = b"%s %d %s\n%s" % (request_id.encode(), time.time() * 1000, store.node_id.encode(),
                                         json.dumps({"body": {"n": n}}).encode())
            store.enqueue(f"ep{n}", request_id, element, 300)
        enqueue_ms = (time.perf_counter() - started) * 1000 / count
        used, keys = memory_of(client, settings.prefix + ":*")
        guard_ms = statistics.median(timed_ms(store.swap_guards, uuid.uuid4().hex, 60) for _ in range(5))
        row.update(bytes_per_endpoint=used / count, keys=keys, enqueue_ms=enqueue_ms,
                   housekeeping_ms=guard_ms, load_after=load_average())
    finally:
        drop(client, settings.prefix + ":*")
        closed.set()
    return row


def main(argv: list[str] | None = None) -> int:
    quiet_environment()  # stdout carries the figures only (the housekeeping would print metrics)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, nargs="+", default=[10, 100, 1000],
                        help="subscribers of one topic at each step")
    parser.add_argument("--endpoints", type=int, nargs="+", default=[100, 1000, 10000],
                        help="endpoints with one waiting request each, at each step")
    parser.add_argument("--busy", action="store_true", help="a spinning process pinned to core 1")
    args = parser.parse_args(argv)
    client = connect_redis()
    spinner = busy_load(args.busy)
    try:
        for count in args.subscribers:
            print(json.dumps({"bus": bench_bus(client, count)}), flush=True)
        for count in args.endpoints:
            print(json.dumps({"pending": bench_pending(count)}), flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
