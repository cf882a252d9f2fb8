"""One Redis against a Redis Cluster: the pending queue's and the bus's throughput, p99 and cost per
operation on each, in alternating rounds of the same run.

Everything runs against servers started here: one redis-server and a private cluster of
``--masters`` shards (``--replicas`` each, none by default: the shards' own cost), so the CPU
counted is ours alone. Each round runs the same load on one target, then the other (the order
swapped every round: load on a shared machine drifts):

- pending: ``bench/pending_bench.py``'s throughput round (``--services`` endpoints served by
  ``--service-procs`` processes, ``--callers`` caller processes with ``--in-flight`` calls each);
  the endpoints' slots spread over every shard;
- bus: one process publishing with ``--publishers`` threads through ``BusStore.publish`` (the
  ingest script the API runs), one ``switchyard bus worker`` delivering to a subscriber here
  (``max`` 100, ``timeout`` 0); publish latency, and publish-to-handler latency. A bus is one hash
  tag, so on a cluster one shard carries all of it.

Printed per round and as the median of the rounds: operations/s, p50/p99, CPU per operation of
the clients (callers and services; publisher and worker) and of Redis (every server of the
cluster), from /proc; errors (calls that raised, publishes refused, events never delivered: must
be 0); and the ratio cluster / one node. On 2 cores the shards share the CPU with the clients:
the figure to watch is the cost per operation, and no errors.

    .venv/bin/python bench/cluster_bench.py                    # about two minutes
    .venv/bin/python bench/cluster_bench.py --rounds 3 --seconds 4 --replicas 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import pending_bench  # noqa: E402
from bench.bus_bench import Receiver  # noqa: E402
from bench.stats import cpu_seconds, load_average, percentiles, quiet_environment  # noqa: E402
from switchyard.bus.settings import BusSettings  # noqa: E402
from switchyard.bus.store import BusStore, event_json  # noqa: E402
from switchyard.core.config import REDIS_CLUSTER, Connections  # noqa: E402
from switchyard.core.redis_client import connect_redis  # noqa: E402
from tests.pending.conftest import PrivateRedis  # noqa: E402
from tests.redis_cluster import PrivateRedisCluster  # noqa: E402

TOPIC = "bench"
ROOT_KEY = "bench-root"
SETTLE_S = 30.0  # the longest a published event may take to reach the subscriber


@dataclass
class Target:
    """One Redis to run rounds on: its URL, whether it is a cluster, its server processes."""

    name: str
    url: str
    cluster: bool
    redis_pids: list[int]
    ports: list[int]

    @property
    def env(self) -> dict[str, str]:
        return {"SWITCHYARD_REDIS_URL": self.url, "SWITCHYARD_REDIS_CLUSTER": "1" if self.cluster else "0"}

    def connections(self) -> Connections:
        return Connections(redis_url=self.url, redis_cluster=self.cluster)

    def commands(self) -> Counter[str]:
        """Commands run so far (INFO commandstats), summed over every server; on a cluster also the
        PUBLISH messages the servers received over the cluster bus (classic pub/sub is broadcast
        to every node: each PUBLISH costs every other server a message)."""
        counts: Counter[str] = Counter()
        for port in self.ports:
            with redis.Redis(port=port) as client:
                stats = client.info("commandstats")
                if self.cluster:
                    received = client.cluster("info").get("cluster_stats_messages_publish_received", 0)
                    counts["cluster bus: publish received"] += int(received)
            counts.update({name.removeprefix("cmdstat_"): c["calls"] for name, c in stats.items()})
        return counts

    def measured(self, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``run()``'s figures and the Redis commands per operation it cost (those of at least
        0.05 per operation; the rounds' own INFO left out)."""
        before = self.commands()
        result = run()
        ran = self.commands() - before
        ops = max(1, result["ops"])
        result["commands_per_op"] = {name: round(n / ops, 2) for name, n in sorted(ran.items())
                                     if n / ops >= 0.05 and name != "info"}
        return result


def bus_settings(name: str) -> BusSettings:
    return BusSettings(name=name, root_key=ROOT_KEY, allow_http_callbacks=True, callback_allow="127.0.0.1")


# ---------------------------------------------------------------- the bus's processes


def publisher_process(url: str, name: str, token: str, threads: int, seconds: float) -> None:
    """Publish from ``threads`` threads for ``seconds``; print latencies, errors and this process's CPU."""
    connections = Connections(redis_url=url, redis_cluster=REDIS_CLUSTER.read())
    store = BusStore(connect_redis(connections), bus_settings(name))
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    print("ready", flush=True)
    sys.stdin.readline()
    cpu_before = time.process_time()
    deadline = time.perf_counter() + seconds

    def publish() -> None:
        mine = []
        while (now := time.perf_counter()) < deadline:
            event = event_json(TOPIC, "update", "https://api.example.com/w/1", int(time.time() * 1000),
                               {"s": time.time()})
            try:
                store.publish(TOPIC, token, event)
            except Exception as exc:  # counted and reported: a benchmark's figures need 0
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            mine.append(time.perf_counter() - now)
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=publish) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps({"latencies": latencies, "cpu_s": time.process_time() - cpu_before,
                      "errors": len(errors), "first_errors": sorted(set(errors))[:3]}), flush=True)


class BusSide:
    """One target's bus: a subscriber here, a worker process; ``round`` publishes from a process."""

    def __init__(self, procs: pending_bench.Procs, target: Target) -> None:
        self.procs, self.target = procs, target
        self.name = f"bench{uuid.uuid4().hex[:6]}"
        self.store = BusStore(connect_redis(target.connections()), bus_settings(self.name))
        self.receiver = Receiver()
        self.store.subscribe(self.store.create_token("sub"), [TOPIC], self.receiver.url, "bench", 100, 0)
        self.token = self.store.create_token("pub")
        self.worker = procs.start("-m", "switchyard", "bus", "worker", "--threads", "4", ready=False, env={
            **target.env, "SWITCHYARD_BUS_NAME": self.name, "SWITCHYARD_BUS_ALLOW_HTTP_CALLBACKS": "1",
            "SWITCHYARD_BUS_CALLBACK_ALLOW": "127.0.0.1", "SWITCHYARD_LOG_LEVEL": "ERROR"})
        if "worker" not in (line := self.worker.stdout.readline()):
            raise SystemExit(f"the bus worker on {target.name} did not start: {line!r}")

    def round(self, threads: int, seconds: float) -> dict[str, Any]:
        me = str(Path(__file__).resolve())
        publisher = self.procs.start(me, "_publisher", self.target.url, self.name, self.token, str(threads),
                                     str(seconds), stdin=True, env=self.target.env)
        others = [self.worker.pid, *self.target.redis_pids]
        delivered_before = len(self.receiver.latencies)
        cpu_before = [cpu_seconds(pid) for pid in others]
        publisher.stdin.write("go\n")
        publisher.stdin.flush()
        report = json.loads(publisher.stdout.readline())
        published = len(report["latencies"])
        deadline = time.monotonic() + SETTLE_S
        while len(self.receiver.latencies) - delivered_before < published and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu_after = [cpu_seconds(pid) for pid in others]
        self.procs.stop(publisher)
        delivered = self.receiver.latencies[delivered_before:]
        worker_cpu, *redis_cpu = (after - before for after, before in zip(cpu_after, cpu_before, strict=True))
        per_event = {"publisher": report["cpu_s"], "worker": worker_cpu, "redis": sum(redis_cpu)}
        per_event = {k: round(v / max(1, published) * 1e6) for k, v in per_event.items()}
        publish_ms = percentiles([x * 1000 for x in report["latencies"]])
        delivery_ms = percentiles(delivered)
        result: dict[str, Any] = {
            "ops": published, "ops_per_s": round(published / seconds),
            "p50_ms": round(publish_ms.get("p50", 0), 2), "p99_ms": round(publish_ms.get("p99", 0), 2),
            "delivery_p50_ms": round(delivery_ms.get("p50", 0), 1),
            "delivery_p99_ms": round(delivery_ms.get("p99", 0), 1),
            "cpu_us_per_op": {"client": per_event["publisher"] + per_event["worker"], **per_event,
                              "total": sum(per_event.values())},
            "errors": report["errors"] + max(0, published - len(delivered)),
        }
        if report["first_errors"]:
            result["first_errors"] = report["first_errors"]
        return result

    def close(self) -> None:
        self.receiver.server.shutdown()


# ------------------------------------------------------------------------- harness


class PendingSide:
    """One target's polling services (pending_bench's service processes, on a prefix of their own)."""

    def __init__(self, procs: pending_bench.Procs, target: Target, args: argparse.Namespace) -> None:
        self.procs, self.target, self.args = procs, target, args
        self.prefix = f"bench{uuid.uuid4().hex[:6]}"
        self.names = pending_bench.endpoints(args.services)
        me = str(Path(pending_bench.__file__).resolve())
        self.services = [procs.start(me, "_service", target.url, self.prefix,
                                     ",".join(pending_bench.endpoints(args.services, i, args.service_procs)),
                                     str(args.pollers), env=target.env) for i in range(args.service_procs)]

    def round(self) -> dict[str, Any]:
        a = self.args
        result = pending_bench.throughput(self.procs, "library", self.target.url, self.prefix, self.names,
                                          a.callers, a.in_flight, a.seconds, self.services,
                                          self.target.redis_pids, env=self.target.env)
        costs = result.pop("cpu_us_per_call")
        return {"ops": result["calls"], "ops_per_s": result["calls_per_s"], "p50_ms": result["p50_ms"],
                "p99_ms": result["p99_ms"],
                "cpu_us_per_op": {"client": costs["callers"] + costs["services"], **costs},
                "errors": result["errors"], **({"first_errors": result["first_errors"]}
                                               if "first_errors" in result else {})}


FIGURES = ("ops_per_s", "p50_ms", "p99_ms")


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of the rounds, figure by figure; errors summed."""
    out: dict[str, Any] = {k: statistics.median(r[k] for r in rounds) for k in FIGURES}
    out["cpu_us_per_op"] = {k: statistics.median(r["cpu_us_per_op"][k] for r in rounds)
                            for k in rounds[0]["cpu_us_per_op"]}
    out["errors"] = sum(r["errors"] for r in rounds)
    return out


def ratios(single: dict[str, Any], cluster: dict[str, Any]) -> dict[str, float]:
    """cluster / one node, for the throughput, the latencies and the CPU per operation."""
    out = {k: round(cluster[k] / single[k], 2) for k in FIGURES if single[k]}
    out.update({f"cpu_{k}": round(cluster["cpu_us_per_op"][k] / single["cpu_us_per_op"][k], 2)
                for k in ("client", "redis", "total") if single["cpu_us_per_op"][k]})
    return out


def line(kind: str, target: str, r: dict[str, Any]) -> str:
    cpu = r["cpu_us_per_op"]
    extra = f", delivery p99 {r['delivery_p99_ms']} ms" if "delivery_p99_ms" in r else ""
    return (f"{kind:7} {target:7} {r['ops_per_s']:>7,.0f} ops/s  p50 {r['p50_ms']:.2f} ms  "
            f"p99 {r['p99_ms']:.2f} ms{extra}  CPU/op: client {cpu['client']:.0f} us + Redis "
            f"{cpu['redis']:.0f} us = {cpu['total']:.0f} us  errors {r['errors']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs both targets, both parts")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each measurement")
    parser.add_argument("--masters", type=int, default=3, help="the cluster's shards")
    parser.add_argument("--replicas", type=int, default=0, help="replicas per shard (their CPU is counted)")
    parser.add_argument("--services", type=int, default=30, help="pending endpoints")
    parser.add_argument("--service-procs", type=int, default=2)
    parser.add_argument("--pollers", type=int, default=2, help="pollers per endpoint")
    parser.add_argument("--callers", type=int, default=2, help="pending caller processes")
    parser.add_argument("--in-flight", type=int, default=50, help="concurrent calls per caller process")
    parser.add_argument("--publishers", type=int, default=8, help="bus publishing threads")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    quiet_environment()
    results: dict[str, Any] = {"load_average_before": load_average(), "setup": vars(args) | {"json": None}}
    procs = pending_bench.Procs()
    with tempfile.TemporaryDirectory() as workdir:
        single = PrivateRedis(Path(workdir) / "single")
        (Path(workdir) / "single").mkdir()
        single.start()
        cluster = PrivateRedisCluster(Path(workdir) / "cluster", args.masters, args.replicas)
        buses: list[BusSide] = []
        try:
            cluster.start()
            assert single.proc is not None
            targets = [Target("single", single.url, False, [single.proc.pid], [single.port]),
                       Target("cluster", cluster.url, True, cluster.pids(), cluster.ports)]
            pending = {t.name: PendingSide(procs, t, args) for t in targets}
            buses = [BusSide(procs, t) for t in targets]
            bus = {b.target.name: b for b in buses}
            rounds: dict[str, dict[str, list[dict[str, Any]]]] = {
                kind: {t.name: [] for t in targets} for kind in ("pending", "bus")}
            for number in range(args.rounds):
                order = targets if number % 2 == 0 else targets[::-1]
                for target in order:
                    r = target.measured(pending[target.name].round)
                    rounds["pending"][target.name].append(r)
                    print(line("pending", target.name, r), file=sys.stderr, flush=True)
                for target in order:
                    r = target.measured(lambda t=target: bus[t.name].round(args.publishers, args.seconds))
                    rounds["bus"][target.name].append(r)
                    print(line("bus", target.name, r), file=sys.stderr, flush=True)
            results["rounds"] = rounds
            for kind, by_target in rounds.items():
                medians = {name: summary(rs) for name, rs in by_target.items()}
                results[kind] = {**medians,
                                 "cluster_over_single": ratios(medians["single"], medians["cluster"])}
        finally:
            procs.stop_all()
            for side in buses:
                side.close()
            cluster.stop()
            single.stop()
    results["load_average_after"] = load_average()
    text = json.dumps(results, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    for kind in ("pending", "bus"):
        for name in ("single", "cluster"):
            print(line(kind, name, results[kind][name]) + "  (median)")
        print(f"{kind:7} cluster / single: {results[kind]['cluster_over_single']}")
    print(f"load average before / after: {results['load_average_before']} / {results['load_average_after']}")
    errors = sum(results[k][n]["errors"] for k in ("pending", "bus") for n in ("single", "cluster"))
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_publisher":
        publisher_process(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
        raise SystemExit(0)
    raise SystemExit(main())
