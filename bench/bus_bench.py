"""Benchmark of the event bus beside Routemaster's published figures.

On a private redis-server (its memory and load are the bus's alone), with the API served by
``switchyard bus serve`` and delivery by ``switchyard bus worker`` (separate processes, as deployed):

0. baseline, same run: the same clients against the same gateway (``switchyard.local.http_gateway``,
   its own process) serving a handler that only answers 200: the most one gateway process answers
   on this machine at this load, so that the ingest figure can be read as a share of it;
1. ingest: events/s accepted through the HTTP API by ``--procs`` client processes of
   ``--connections`` keep-alive connections each, one subscriber on the topic (one fan-out);
2. delivery latency from the publisher's POST to the subscriber's handler (which then answers
   204), p50/p99, with ``timeout`` 0 at ``max`` 1 and ``max`` 100, at ``--rate`` events/s;
3. Redis memory per million queued events (``used_memory`` delta over ``--queued`` events of a
   typical size, ingested by the same Lua script with no worker running).

    .venv/bin/python bench/bus_bench.py [--duration 10] [--procs 3] [--connections 4]

Routemaster's figures: ~150 events/s per ingest thread (2,194/s at scale); median delivery latency
340-820 ms at batch size 100. Results go to bench/results/bus_bench.json.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from switchyard.bus.settings import BusSettings  # noqa: E402
from switchyard.bus.store import BusStore, event_json  # noqa: E402
from switchyard.core.config import Connections  # noqa: E402
from switchyard.core.redis_client import connect_redis  # noqa: E402

ROUTEMASTER = {"ingest_per_thread": 150, "ingest_at_scale": 2194, "p50_latency_batch100_ms": "340-820"}
ROOT_KEY = "bench-root"
BUS = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))] if s else float("nan")


def basic(token: str) -> str:
    return "Basic " + base64.b64encode(f"{token}:x".encode()).decode()


class Stack:
    """A private redis-server, ``switchyard bus serve`` and (on demand) ``switchyard bus worker``."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="bus-bench-")
        self.redis_port, self.api_port = free_port(), free_port()
        self.procs: list[subprocess.Popen] = []
        self.redis = subprocess.Popen(["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no", "--dir", self.dir],
                                      stdout=subprocess.DEVNULL)
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "SWITCHYARD_REDIS_URL": self.redis_url,
                    "SWITCHYARD_BUS_NAME": BUS, "SWITCHYARD_BUS_ROOT_KEY": ROOT_KEY,
                    "SWITCHYARD_BUS_ALLOW_HTTP_CALLBACKS": "1", "SWITCHYARD_BUS_CALLBACK_ALLOW": "127.0.0.1",
                    "SWITCHYARD_LOG_LEVEL": "ERROR"}
        self.client = connect_redis(Connections(redis_url=self.redis_url))
        for _ in range(100):
            try:
                self.client.ping()
                break
            except Exception:
                time.sleep(0.05)
        settings = BusSettings(name=BUS, root_key=ROOT_KEY, allow_http_callbacks=True,
                               callback_allow="127.0.0.1")
        self.store = BusStore(self.client, settings)

    def start(self, *command: str, ready: str, module: str = "switchyard") -> subprocess.Popen:
        """``python -m switchyard bus <command>`` (or ``-m <module> <command>``), once it prints ``ready``."""
        argv = [sys.executable, "-m", module, *(("bus",) if module == "switchyard" else ()), *command]
        proc = subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if ready not in line:
            raise RuntimeError(f"{command} did not start: {line!r}")
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.wait(30)
        self.redis.terminate()
        self.redis.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _ingest_worker(port: int, token: str, topic: str, connections: int, seconds: float, out) -> None:
    counts = [0] * connections
    body = json.dumps({"type": "update", "url": "https://api.example.com/widgets/123456"}).encode()
    headers = {"Authorization": basic(token), "Content-Type": "application/json"}
    deadline = time.monotonic() + seconds

    def loop(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.monotonic() < deadline:
            conn.request("POST", f"/topics/{topic}", body, headers)
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                counts[i] += 1
        conn.close()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(sum(counts))


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (load-independent cost: /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def floor_handler(event: dict, context: object) -> dict:
    """The same-run baseline: a Lambda proxy handler that only answers 200, behind the same gateway."""
    return {"statusCode": 200, "body": "", "multiValueHeaders": {"Content-Type": ["text/plain"]}}


def bench_floor(stack: Stack, procs: int, connections: int, seconds: float) -> dict:
    """The ingest clients against ``floor_handler`` in its own gateway process: what one gateway
    process answers on this machine now, with no bus work (the ceiling of the bus's ingest)."""
    port = free_port()
    proc = stack.start("bench.bus_bench:floor_handler", "--port", str(port), "--threads", "16",
                       ready="serving", module="switchyard.local.http_gateway")
    try:
        return bench_ingest(stack, procs, connections, seconds, port=port, api_pid=proc.pid)
    finally:
        stack.procs.remove(proc)
        proc.terminate()
        proc.wait(30)


def bench_ingest(stack: Stack, procs: int, connections: int, seconds: float, port: int | None = None,
                 api_pid: int | None = None) -> dict:
    publisher = stack.store.create_token("ingest")
    stack.store.subscribe("ingest-sub", ["ingest"], "https://sub.example/e", "u", 100, 3_600_000)
    queue: mp.Queue = mp.Queue()
    args = (port or stack.api_port, publisher, "ingest", connections, seconds, queue)
    workers = [mp.Process(target=_ingest_worker, args=args) for _ in range(procs)]
    api_pid, redis_pid = api_pid or stack.procs[0].pid, stack.redis.pid
    cpu_api, cpu_redis = cpu_seconds(api_pid), cpu_seconds(redis_pid)
    started = time.monotonic()
    for w in workers:
        w.start()
    total = sum(queue.get() for _ in workers)
    for w in workers:
        w.join()
    elapsed = time.monotonic() - started
    api_ms = (cpu_seconds(api_pid) - cpu_api) * 1000 / max(1, total)
    redis_ms = (cpu_seconds(redis_pid) - cpu_redis) * 1000 / max(1, total)
    return {"events": total, "seconds": round(elapsed, 2), "events_per_s": round(total / elapsed, 1),
            "load": round(os.getloadavg()[0], 2),
            "client_processes": procs, "connections": procs * connections, "api_processes": 1,
            "api_cpu_ms_per_event": round(api_ms, 3), "redis_cpu_ms_per_event": round(redis_ms, 3),
            "events_per_api_core_s": round(1000 / api_ms, 0) if api_ms else None}


class Receiver:
    """The subscriber: records publish-to-handler latency of every event, answers 204."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.batches: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                events = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                now = time.time()
                outer.latencies.extend((now - e["data"]["s"]) * 1000 for e in events)
                outer.batches.append(len(events))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def bench_latency(stack: Stack, max_events: int, rate: float, seconds: float, phase: int) -> dict:
    topic = "latency_" + "abcdefghij"[phase]
    receiver = Receiver()
    sub_token = stack.store.create_token(f"sub-{phase}")
    stack.store.subscribe(sub_token, [topic], receiver.url, "bench", max_events, 0)
    pub = stack.store.create_token(f"pub-{phase}")
    conn = http.client.HTTPConnection("127.0.0.1", stack.api_port, timeout=30)
    headers = {"Authorization": basic(pub), "Content-Type": "application/json"}
    sent = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        event = {"type": "update", "url": "https://api.example.com/w/1", "data": {"s": time.time()}}
        body = json.dumps(event)
        conn.request("POST", f"/topics/{topic}", body, headers)
        response = conn.getresponse()
        response.read()
        sent += response.status == 200
        pause = started + sent / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    deadline = time.monotonic() + 30
    while len(receiver.latencies) < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    receiver.server.shutdown()
    lat = receiver.latencies
    return {"max": max_events, "timeout_ms": 0, "rate": rate, "sent": sent, "delivered": len(lat),
            "p50_ms": round(percentile(lat, 50), 1), "p99_ms": round(percentile(lat, 99), 1),
            "max_ms": round(max(lat, default=float("nan")), 1),
            "mean_batch": round(sum(receiver.batches) / max(1, len(receiver.batches)), 1)}


def bench_memory(stack: Stack, n: int) -> dict:
    store = stack.store
    store.subscribe("memory-sub", ["memory"], "https://sub.example/e", "u", 100, 3_600_000)
    publisher = store.create_token("memory-pub")
    now = int(time.time() * 1000)
    event = event_json("memory", "update", "https://api.example.com/widgets/123456", now, None)
    before = int(stack.client.info("memory")["used_memory"])
    script = store.script("ingest")
    for start in range(0, n, 1000):
        pipe = stack.client.pipeline(transaction=False)
        for _ in range(min(1000, n - start)):
            script(keys=[store.topics_key, store.topic_events_key, store.tokens_key],
                   args=[store.prefix, "memory", publisher, event], client=pipe)
        pipe.execute()
    after = int(stack.client.info("memory")["used_memory"])
    return {"events": n, "event_json_bytes": len(event), "used_memory_delta": after - before,
            "bytes_per_event": round((after - before) / n, 1),
            "mb_per_million_events": round((after - before) / n * 1e6 / 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per ingest/latency phase")
    parser.add_argument("--procs", type=int, default=3, help="ingest client processes")
    parser.add_argument("--connections", type=int, default=4, help="keep-alive connections per process")
    parser.add_argument("--rate", type=float, default=50.0, help="events/s offered in the latency phases")
    parser.add_argument("--queued", type=int, default=200_000, help="events queued for the memory figure")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bus_bench.json"))
    args = parser.parse_args()
    stack = Stack()
    results: dict = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "routemaster": ROUTEMASTER}
    try:
        results["floor"] = floor = bench_floor(stack, args.procs, args.connections, args.duration)
        print(f"baseline, same run: {floor['events_per_s']:,} requests/s through one gateway process whose "
              f"handler only answers 200 (gateway CPU {floor['api_cpu_ms_per_event']} ms/request; "
              f"load {floor['load']})", flush=True)
        stack.start("serve", "--port", str(stack.api_port), "--threads", "16", ready="API on")
        results["ingest"] = ing = bench_ingest(stack, args.procs, args.connections, args.duration)
        ing["of_floor"] = round(ing["events_per_s"] / floor["events_per_s"], 2)
        print(f"ingest: {ing['events_per_s']:,} events/s through one API process ({ing['connections']} "
              f"connections; {ing['of_floor']:.0%} of the baseline; load {ing['load']}); API CPU "
              f"{ing['api_cpu_ms_per_event']} ms/event = {ing['events_per_api_core_s']:,} events/s per API "
              f"core, Redis CPU {ing['redis_cpu_ms_per_event']} ms/event  "
              f"[Routemaster: ~150/s per ingest thread, 2,194/s at scale; aim >= 1,500/s]", flush=True)
        stack.start("worker", "--threads", "4", ready="worker")
        results["latency"] = []
        # max 100 a second time at a higher rate, so that batches actually fill
        for phase, (max_events, rate) in enumerate(((1, args.rate), (100, args.rate), (100, 8 * args.rate))):
            r = bench_latency(stack, max_events, rate, args.duration, phase)
            results["latency"].append(r)
            print(f"delivery latency, max={max_events} timeout=0 at {rate:g}/s: p50 {r['p50_ms']} ms, "
                  f"p99 {r['p99_ms']} ms, {r['delivered']}/{r['sent']} delivered, "
                  f"mean batch {r['mean_batch']}  [Routemaster: median 340-820 ms at batch size 100]",
                  flush=True)
        stack.procs[-1].terminate()  # no worker: the memory phase keeps every event queued
        stack.procs[-1].wait(30)
        stack.procs.pop()
        results["memory"] = bench_memory(stack, args.queued)
        print(f"Redis memory: {results['memory']['bytes_per_event']} bytes per queued event "
              f"({results['memory']['event_json_bytes']}-byte event) = "
              f"{results['memory']['mb_per_million_events']} MB per million", flush=True)
    finally:
        stack.close()
    results["load_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"load average before/after: {results['load_before'][0]:.1f} / {results['load_after'][0]:.1f}; "
          f"results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
