"""Pending request queue benchmark: the library and the HTTP long poll against two raw Redis lists.

Everything runs against a private redis-server (started here, on a free port) so the command
counts are ours alone; with ``--cluster-url`` measurement 1 runs on that Redis Cluster too (the
library in cluster mode against the same raw lists, their keys under one hash tag). Callers and
services are separate processes. Four measurements:

1. round trip, one call at a time: raw lists (caller LPUSH + BRPOP its reply list, service BRPOP +
   LPUSH) against ``queue_and_wait`` -> ``dequeue`` -> ``apply_response``, alternating in short
   rounds (load on a shared machine drifts), p50/p99 per side and the median of per-round ratios;
2. throughput with many services: ``--services`` endpoints served by ``--service-procs``
   processes, ``--callers`` caller processes with ``--in-flight`` calls each, raw and library,
   with the CPU each call cost the callers, the services and Redis (from /proc) and the ceiling
   that implies on this machine's cores: on a shared 2-core machine calls/s follow the load of
   the moment, the CPU per call does not (much). Both sides are bound by redis-py's Python CPU
   per round trip (~100-150 us), not by how the harness waits: the raw lists pay four per call;
3. round trip through HTTP: node B is ``switchyard pending serve``, the polling service is a
   ``PollingService`` process, the caller a library node in this process; in the same rounds the
   same call answered by a process calling node B's resolver in-process (the pending API's own
   share) and by a library service (the queue's), so what the gateway and HTTP add shows;
4. Redis commands per fast call, from INFO commandstats (client commands and, inside scripts,
   the commands they ran), the raw baseline's being four.

    .venv/bin/python bench/pending_bench.py                   # about a minute and a half
    .venv/bin/python bench/pending_bench.py --rounds 6 --seconds 3 --services 100 --callers 2
    .venv/bin/python bench/pending_bench.py --sequential-only --cluster-url redis://127.0.0.1:7100
    SWITCHYARD_BENCH_NO_HIREDIS=1 .venv/bin/python bench/pending_bench.py   # redis-py's Python parser
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

if os.environ.get("SWITCHYARD_BENCH_NO_HIREDIS") == "1":  # A/B: redis-py's pure-Python parser
    sys.modules["hiredis"] = None  # type: ignore[assignment]  # (children inherit the variable)

import redis
from redis.cluster import RedisCluster
from redis.utils import HIREDIS_AVAILABLE

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.stats import cpu_seconds, load_average  # noqa: E402
from switchyard.core.latency import LatencySummary  # noqa: E402
from switchyard.pending import PendingQueue, PendingSettings  # noqa: E402
from switchyard.pending.client import PollingService  # noqa: E402
from tests.pending.conftest import PrivateRedis, free_port  # noqa: E402

TOKEN = "bench-token"
RAW = "raw"  # key prefix of the baseline's lists


def bench_settings(url: str, prefix: str, cluster: bool = False) -> PendingSettings:
    """On ``url``; a Redis Cluster if ``cluster`` or SWITCHYARD_REDIS_CLUSTER=1 (bench/cluster_bench.py's
    rounds, whose child processes inherit the variable)."""
    from switchyard.core.config import REDIS_CLUSTER, Connections

    connections = Connections(redis_url=url, redis_cluster=cluster or REDIS_CLUSTER.read())
    return PendingSettings(prefix=prefix, connections=connections, redis_connections=256)


def endpoints(count: int, proc: int = 0, procs: int = 1) -> list[str]:
    return [f"svc{i}" for i in range(count) if i % procs == proc]


# ------------------------------------------------------------------ processes


def serve_library(url: str, prefix: str, names: list[str], pollers: int, cluster: bool = False) -> None:
    with PendingQueue(bench_settings(url, prefix, cluster)) as node:
        for name in names:
            for _ in range(pollers):
                threading.Thread(target=node.serve, args=(name, lambda request: request.body),
                                 daemon=True).start()
        print("ready", flush=True)
        threading.Event().wait()


def raw_client(url: str, connections: int = 16, cluster: bool = False) -> redis.Redis | RedisCluster:
    """Blocking pops wait longer than redis-py's default 5 s socket timeout."""
    if cluster:
        return RedisCluster.from_url(url, max_connections=connections, socket_timeout=None)
    return redis.Redis.from_url(url, max_connections=connections, socket_timeout=None)


def raw_list(endpoint: str) -> str:
    """The baseline's request list of ``endpoint``; its reply lists share its hash tag (one slot)."""
    return f"{RAW}:{{{endpoint}}}"


def serve_raw(url: str, names: list[str], pollers: int, cluster: bool = False) -> None:
    client = raw_client(url, len(names) * pollers + 8, cluster)

    def loop(endpoint: str) -> None:
        while True:
            item = client.brpop([raw_list(endpoint)], timeout=30)
            if item is not None:
                reply_to, _, body = item[1].partition(b" ")
                client.lpush(reply_to, body)

    for name in names:
        for _ in range(pollers):
            threading.Thread(target=loop, args=(name,), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


def serve_http(url: str, names: list[str], pollers: int) -> None:
    services = [PollingService(url, name, TOKEN, lambda request: request.body, concurrency=pollers).start()
                for name in names]
    print("ready", flush=True)
    threading.Event().wait()
    for service in services:
        service.stop()


def serve_resolver(url: str, prefix: str, endpoint: str) -> None:
    """The HTTP API's own share: a polling service that calls node B's resolver in-process, with
    the events the local gateway would build (its own ``event_from_environ``), no HTTP at all."""
    import io

    from switchyard.local.http_gateway import event_from_environ
    from switchyard.pending.api import TokenStore, build_app

    def event(method: str, path: str, query: str = "", body: bytes = b"") -> dict:
        return event_from_environ({
            "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
            "HTTP_AUTHORIZATION": f"Bearer {TOKEN}", "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)})

    with PendingQueue(bench_settings(url, prefix)) as node:
        app = build_app(node, TokenStore.static({endpoint: TOKEN}))
        print("ready", flush=True)
        while True:
            reply = app.resolve(event("GET", f"/endpoints/{endpoint}/next", "wait=25"), None)
            if reply["statusCode"] != 200:
                continue
            request = json.loads(reply["body"])
            body = json.dumps({"take": request["take"], "ok": True, "body": request["body"]}).encode()
            answer = app.resolve(event("POST", f"/endpoints/{endpoint}/requests/{request['id']}/response",
                                       body=body), None)
            if answer["statusCode"] != 200:
                raise SystemExit(f"response refused: {answer}")


class RawCaller:
    """The baseline's caller: LPUSH the request with its reply list's name, BRPOP the reply (a
    list of its thread's, under the endpoint's hash tag)."""

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        self.client = client
        self.local = threading.local()

    def call(self, endpoint: str, body: str) -> bytes:
        replies = getattr(self.local, "replies", None)
        if replies is None:
            replies = self.local.replies = {}
        reply_to = replies.get(endpoint)
        if reply_to is None:
            reply_to = replies[endpoint] = f"{raw_list(endpoint)}:reply:{uuid.uuid4().hex}"
        self.client.lpush(raw_list(endpoint), f"{reply_to} {body}".encode())
        return self.client.brpop([reply_to], timeout=30)[1]


def caller_process(side: str, url: str, prefix: str, names: list[str], in_flight: int,
                   seconds: float) -> None:
    """Run ``in_flight`` callers for ``seconds``; print their latencies and this process's CPU."""
    if side == "raw":
        call: Callable[[str, str], object] = RawCaller(raw_client(url, in_flight + 8)).call
        node = None
    else:
        node = PendingQueue(bench_settings(url, prefix)).start()
        call = node.queue_and_wait
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    sys.stdin.readline()  # all caller processes start together
    cpu_before = time.process_time()
    deadline = time.perf_counter() + seconds

    def worker(index: int) -> None:
        mine = []
        endpoint = names[index % len(names)]
        while (now := time.perf_counter()) < deadline:
            try:
                call(endpoint, "x")
            except Exception as exc:  # counted and reported: a benchmark's figures need 0
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            mine.append(time.perf_counter() - now)
        with lock:
            latencies.extend(mine)

    with ThreadPoolExecutor(in_flight) as pool:
        list(pool.map(worker, range(in_flight)))
    report: dict[str, object] = {"latencies": latencies, "cpu_s": time.process_time() - cpu_before,
                                 "errors": len(errors), "first_errors": sorted(set(errors))[:3]}
    if node is not None:
        report["round_trips"] = node.redis_store.batch.round_trips
        report["script_calls"] = node.redis_store.batch.calls
    print(json.dumps(report), flush=True)
    if node is not None:
        node.close()


# ------------------------------------------------------------------- harness


class Procs:
    """Child processes of this benchmark; all killed at the end."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen] = []

    def start(self, *args: str, ready: bool = True, stdin: bool = False,
              env: Mapping[str, str] | None = None) -> subprocess.Popen:
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "POWERTOOLS_METRICS_DISABLED": "true", **(env or {})}
        proc = subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE, text=True,
                                stdin=subprocess.PIPE if stdin else None)
        self.children.append(proc)
        if ready:
            line = proc.stdout.readline()
            if "ready" not in line and "serving" not in line:
                raise SystemExit(f"{args} did not start: {line!r}")
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait(10)
        self.children.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.children):
            self.stop(proc)


def sequential(call: Callable[[], object], seconds: float) -> list[float]:
    latencies = []
    deadline = time.perf_counter() + seconds
    while (now := time.perf_counter()) < deadline:
        call()
        latencies.append(time.perf_counter() - now)
    return latencies


def throughput(procs: Procs, side: str, url: str, prefix: str, names: list[str], callers: int,
               in_flight: int, seconds: float, services: list[subprocess.Popen], redis_pids: list[int],
               env: Mapping[str, str] | None = None) -> dict:
    """Calls/s and latency, plus the CPU each call cost the callers, the services and Redis (every
    server of a cluster): the machine's cores divided by that CPU is the ceiling of the side on
    this machine, whatever else runs on it (the calls/s alone move with the load of a shared
    machine). ``env``: the caller processes' extra variables."""
    me = str(Path(__file__).resolve())
    children = [procs.start(me, "_callers", side, url, prefix, ",".join(names), str(in_flight), str(seconds),
                            ready=False, stdin=True, env=env) for _ in range(callers)]
    time.sleep(3 if side == "library" else 1)  # nodes started and subscribed
    services_count = len(services)
    others = [p.pid for p in services] + redis_pids
    cpu_before = [cpu_seconds(pid) for pid in others]
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    latencies: list[float] = []
    caller_cpu = 0.0
    round_trips = script_calls = errors = 0
    first_errors: set[str] = set()
    for child in children:
        report = json.loads(child.stdout.readline())
        latencies.extend(report["latencies"])
        caller_cpu += report["cpu_s"]
        errors += report["errors"]
        first_errors.update(report["first_errors"])
        round_trips += report.get("round_trips", 0)
        script_calls += report.get("script_calls", 0)
    cpu_after = [cpu_seconds(pid) for pid in others]
    for child in children:
        procs.stop(child)
    calls = max(1, len(latencies))
    deltas = [after - before for after, before in zip(cpu_after, cpu_before, strict=True)]
    service_cpu, redis_cpu = sum(deltas[:services_count]), sum(deltas[services_count:])
    per_call = {"callers": caller_cpu, "services": service_cpu, "redis": redis_cpu}
    per_call = {k: round(v / calls * 1e6) for k, v in per_call.items()}
    total_us = sum(per_call.values())
    summary = LatencySummary.of(latencies)
    result: dict[str, object] = {
        "calls": len(latencies), "calls_per_s": round(len(latencies) / seconds),
        "p50_ms": round(summary.p50_ms, 2), "p99_ms": round(summary.p99_ms, 2),
        "cpu_us_per_call": {**per_call, "total": total_us},
        f"cpu_ceiling_calls_per_s_on_{os.cpu_count()}_cores": round(os.cpu_count() * 1e6 / max(1, total_us)),
        "errors": errors,
    }
    if first_errors:
        result["first_errors"] = sorted(first_errors)[:3]
    if script_calls:
        result["caller_scripts_per_round_trip"] = round(script_calls / max(1, round_trips), 2)
    return result


def one_at_a_time(procs: Procs, url: str, prefix: str, rounds: int, seconds: float, cluster: bool = False,
                  counts: redis.Redis | None = None) -> dict[str, object]:
    """Measurement 1 (and 4 with ``counts``, the private server's client): one call at a time,
    raw lists and the library alternating in rounds, each side's service a process of its own."""
    me = str(Path(__file__).resolve())
    flag = str(int(cluster))
    raw_service = procs.start(me, "_raw_service", url, "svc0", "1", flag)
    lib_service = procs.start(me, "_service", url, prefix, "svc0", "1", flag)
    raw = RawCaller(raw_client(url, cluster=cluster))
    result: dict[str, object] = {}
    with PendingQueue(bench_settings(url, prefix, cluster)) as node:
        raw_all, lib_all, ratios = [], [], []
        sequential(lambda: raw.call("svc0", "x"), 0.5)  # warm up both
        sequential(lambda: node.queue_and_wait("svc0", "x"), 0.5)
        for _ in range(rounds):
            r = sequential(lambda: raw.call("svc0", "x"), seconds)
            lib = sequential(lambda: node.queue_and_wait("svc0", "x"), seconds)
            raw_all += r
            lib_all += lib
            ratios.append(statistics.median(lib) / statistics.median(r))
        result["sequential"] = {
            "raw_lists": asdict(LatencySummary.of(raw_all)),
            "library": asdict(LatencySummary.of(lib_all)),
            "p50_ratio_per_round": [round(x, 2) for x in ratios],
            "p50_ratio_median": round(statistics.median(ratios), 2),
            "raw_calls_per_s_one_at_a_time": round(len(raw_all) / (rounds * seconds)),
            "library_calls_per_s_one_at_a_time": round(len(lib_all) / (rounds * seconds)),
        }
        if counts is not None:  # 4. commands per fast call (the service node polls svc0 with one poller)
            result["commands_per_call"] = {
                "library": command_counts(counts, 200, lambda: node.queue_and_wait("svc0", "x")),
                "raw_lists": command_counts(counts, 200, lambda: raw.call("svc0", "x")),
            }
    procs.stop(raw_service)
    procs.stop(lib_service)
    return result


def command_counts(client: redis.Redis, calls: int, do_call: Callable[[], object]) -> dict[str, float]:
    client.config_resetstat()
    for _ in range(calls):
        do_call()
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): round(value["calls"] / calls, 2) for name, value in stats.items()
            if name not in ("cmdstat_config", "cmdstat_info")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="alternating raw/library rounds (sequential)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each round")
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--service-procs", type=int, default=2)
    parser.add_argument("--pollers", type=int, default=2, help="pollers per service")
    parser.add_argument("--callers", type=int, default=2, help="caller processes (throughput)")
    parser.add_argument("--in-flight", type=int, default=100, help="concurrent calls per caller process")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--cluster-url", help="also measure one call at a time on this Redis Cluster "
                                              "(a node's URL, e.g. redis://127.0.0.1:7100)")
    parser.add_argument("--sequential-only", action="store_true",
                        help="only one call at a time and the commands per call (measurements 1 and 4)")
    args = parser.parse_args()

    import tempfile

    me = str(Path(__file__).resolve())
    results: dict[str, object] = {"load_average_before": load_average(),
                                  "redis_parser": "hiredis" if HIREDIS_AVAILABLE else "python"}
    with tempfile.TemporaryDirectory() as workdir:
        server = PrivateRedis(Path(workdir))
        server.start()
        procs = Procs()
        try:
            url, prefix = server.url, f"bench{uuid.uuid4().hex[:6]}"
            client = server.client()
            names = endpoints(args.services)

            # 1. sequential round trip, raw vs library, alternating rounds (and 4., commands per call)
            results.update(one_at_a_time(procs, url, prefix, args.rounds, args.seconds, counts=client))
            if args.cluster_url:
                on_cluster = one_at_a_time(procs, args.cluster_url, prefix, args.rounds, args.seconds,
                                           cluster=True)
                results["cluster_sequential"] = {"url": args.cluster_url, **on_cluster["sequential"]}  # type: ignore[dict-item]
            if args.sequential_only:
                return finish(results, args.json)

            # 2. throughput with many services
            service_args = [(",".join(endpoints(args.services, i, args.service_procs))) for i in
                            range(args.service_procs)]
            raw_services = [procs.start(me, "_raw_service", url, n, str(args.pollers)) for n in service_args]
            results["throughput_raw_lists"] = throughput(procs, "raw", url, prefix, names, args.callers,
                                                         args.in_flight, args.seconds * 2, raw_services,
                                                         [server.proc.pid])
            for p in raw_services:
                procs.stop(p)
            lib_services = [procs.start(me, "_service", url, prefix, n, str(args.pollers))
                            for n in service_args]
            results["throughput_library"] = throughput(procs, "library", url, prefix, names, args.callers,
                                                       args.in_flight, args.seconds * 2, lib_services,
                                                       [server.proc.pid])
            for p in lib_services:
                procs.stop(p)
            results["throughput_setup"] = {"services": args.services, "service_procs": args.service_procs,
                                           "pollers_per_service": args.pollers, "caller_procs": args.callers,
                                           "in_flight_per_caller": args.in_flight}

            # 3. through HTTP: node B serves, a polling service process, the caller here; in the
            # same rounds the same call with node B's resolver called in-process (no HTTP, no
            # gateway) and straight through the library, so each layer's share shows
            port = free_port()
            env = {"SWITCHYARD_REDIS_URL": url, "SWITCHYARD_PENDING_PREFIX": prefix,
                   "SWITCHYARD_PENDING_TOKENS": json.dumps({"http0": TOKEN})}
            os.environ.update(env)
            procs.start("-m", "switchyard", "pending", "serve", "--port", str(port))
            procs.start(me, "_http_service", f"http://127.0.0.1:{port}", "http0", "1")
            procs.start(me, "_resolver_service", url, prefix, "api0")
            procs.start(me, "_service", url, prefix, "svc0", "1")
            layers = {"http_long_poll": "http0", "resolver_in_process": "api0", "library": "svc0"}
            with PendingQueue(bench_settings(url, prefix)) as node:
                seen: dict[str, list[float]] = {name: [] for name in layers}
                for endpoint in layers.values():
                    sequential(lambda e=endpoint: node.queue_and_wait(e, "x"), 0.5)
                for _ in range(args.rounds):
                    for name, endpoint in layers.items():
                        seen[name] += sequential(lambda e=endpoint: node.queue_and_wait(e, "x"),
                                                 args.seconds / 2)
            p50 = {name: LatencySummary.of(values).p50_ms for name, values in seen.items()}
            results["http_long_poll_sequential"] = {
                **{name: asdict(LatencySummary.of(values)) for name, values in seen.items()},
                "p50_ms_share": {
                    "library": round(p50["library"], 2),
                    "pending_api_resolver": round(p50["resolver_in_process"] - p50["library"], 2),
                    "http_gateway_and_client": round(p50["http_long_poll"] - p50["resolver_in_process"], 2),
                },
            }
        finally:
            procs.stop_all()
            server.stop()
    return finish(results, args.json)


def finish(results: dict[str, object], path: Path | None) -> int:
    """Print the results (and write them to ``path``), the load average after them included."""
    results["load_average_after"] = load_average()
    text = json.dumps(results, indent=2)
    print(text)
    if path:
        path.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        role, rest = sys.argv[1], sys.argv[2:]
        if role == "_service":
            serve_library(rest[0], rest[1], rest[2].split(","), int(rest[3]), rest[4:] == ["1"])
        elif role == "_raw_service":
            serve_raw(rest[0], rest[1].split(","), int(rest[2]), rest[3:] == ["1"])
        elif role == "_resolver_service":
            serve_resolver(rest[0], rest[1], rest[2])
        elif role == "_http_service":
            serve_http(rest[0], rest[1].split(","), int(rest[2]))
        elif role == "_callers":
            caller_process(rest[0], rest[1], rest[2], rest[3].split(","), int(rest[4]), float(rest[5]))
        raise SystemExit(0)
    raise SystemExit(main())
