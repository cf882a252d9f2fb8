"""How the keyed RPC control plane's cost grows with the number of keys on one pool.

At each size N (``--sizes 100 1000 10000``), in a vhost of its own (``--vhost``, default
``scale-bench``, made and deleted by the run, so nothing is left on the shared broker), with a
driver that spawns no process per group (``AnsweringDriver``: it remembers what it was told to
start and, for the keys it serves, runs one in-process worker thread):

- orphan path: N orphans over N distinct new keys through the orphan handler (the Lambda function,
  the exact ``aws:rmq`` event), in batches of the local bridge's size: new keys per second;
- activity path: N reports over the N active groups through the activity handler: reports/s;
- reconciler pass with N groups and N queues: wall p50 / p99, CPU, the management API's bytes and
  time per pass, Redis round trips and commands per pass, the pool state's Redis memory per group;
  once with the queue listing on every pass, once as deployed (``DepthCadence``: the listing takes
  at most a tenth of the time, passes 0.2 s apart);
- the broker: queues in the vhost, their memory (the queues' own ``memory`` column, summed), and
  the client call p50 to one key while the N queues exist;
- cold start: first response for a new key while N groups exist (local control plane: bridges and
  the reconciler's ticker running, a worker thread started by the driver).

    .venv/bin/python bench/scale_bench.py [--sizes 100 1000 10000] [--queue-type classic] [--busy]
                                          [--json bench/results/scale.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pika
import redis
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.control_plane_bench import first_calls  # noqa: E402
from bench.stats import load_average, percentiles, quiet_environment  # noqa: E402
from switchyard.aws import services  # noqa: E402
from switchyard.core.redis_client import connect_redis  # noqa: E402
from switchyard.local.functions import load_function  # noqa: E402
from switchyard.local.lambda_context import FakeLambdaContext  # noqa: E402
from switchyard.local.rmq_bridge import RmqDelivery, build_rmq_event  # noqa: E402
from switchyard.local.rpc_runtime import LocalControlPlane  # noqa: E402
from switchyard.rpc import protocol  # noqa: E402
from switchyard.rpc.client import RpcClient  # noqa: E402
from switchyard.rpc.control.reconciler import DepthCadence  # noqa: E402
from switchyard.rpc.control.topology import PoolTopology  # noqa: E402
from switchyard.rpc.ports import WorkerGroup, WorkerGroupDriver  # noqa: E402
from switchyard.rpc.service import ControlPlane  # noqa: E402
from switchyard.rpc.settings import ControlSettings, Delays, RpcSettings  # noqa: E402
from switchyard.rpc.store import PoolState  # noqa: E402
from switchyard.rpc.worker import Worker  # noqa: E402
from switchyard.rpc.worker.request import WorkerConfig  # noqa: E402

DEFAULT_VHOST = "scale-bench"
BATCH = 1000  # the local bridge's orphan and activity batch (BridgeSettings)
BUSY_CORE = "1"
LONG = Delays(unbind_s=3600, stop_s=7200)  # nothing is unbound or stopped during a run


def echo(request: Any) -> bytes:
    return request.body


class AnsweringDriver(WorkerGroupDriver):
    """Remembers the groups it was asked to start (``list_running`` answers them); for keys that
    start with ``serve_prefix`` it runs a real ``Worker`` in a thread of this process."""

    def __init__(self, settings: RpcSettings, serve_prefix: str = "\0") -> None:
        self.settings = settings
        self.serve_prefix = serve_prefix
        self.running: set[str] = set()
        self.workers: dict[str, Worker] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, group: WorkerGroup) -> None:
        with self._lock:
            self.running.add(group.key)
            if not group.key.startswith(self.serve_prefix) or group.key in self.workers:
                return
            worker = Worker(echo, WorkerConfig(
                worker_id=f"scale-{uuid.uuid4().hex[:6]}", key=group.key, pool=group.pool,
                requests_queue=protocol.request_queue(group.pool, group.key),
                activity_exchange=protocol.activity_exchange(group.pool)), self.settings)
            self.workers[group.key] = worker
            thread = threading.Thread(target=worker.run, daemon=True)
            self._threads.append(thread)
        thread.start()

    def stop(self, group: WorkerGroup) -> None:
        with self._lock:
            self.running.discard(group.key)
            worker = self.workers.pop(group.key, None)
        if worker is not None:
            worker.stop()

    def list_running(self, pool: str) -> set[str]:
        with self._lock:
            return set(self.running)

    def scale(self, group: WorkerGroup, backlog: int) -> None:
        pass

    def close(self) -> None:
        """Stop every worker and wait for it (before the vhost is deleted under it)."""
        for worker in list(self.workers.values()):
            worker.stop()
        for thread in self._threads:
            thread.join(timeout=10)


class Counting:
    """Redis round trips and commands, counted on the connections of one client."""

    trips = 0
    commands = 0


class CountingConnection(redis.Connection):
    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        Counting.trips += 1
        super().send_packed_command(command, check_health)

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        Counting.commands += 1
        super().send_command(*args, **kwargs)

    def pack_commands(self, commands: Any) -> list[bytes]:
        commands = list(commands)
        Counting.commands += len(commands)
        return super().pack_commands(commands)


class ManagementMeter:
    """Bytes and time of the management API's answers (a response hook on its session)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.seconds = 0.0
        self.requests = 0

    def hook(self, response: requests.Response, *_: Any, **__: Any) -> None:
        self.bytes += len(response.content)
        self.seconds += response.elapsed.total_seconds()
        self.requests += 1


# -- the vhost -------------------------------------------------------------------------------------
def mgmt(settings: RpcSettings, method: str, path: str, **kwargs: Any) -> requests.Response:
    base = settings.connections.management_url.split("@")[-1]
    response = requests.request(method, f"http://{base}/api{path}", auth=("guest", "guest"), timeout=600,
                                **kwargs)
    response.raise_for_status()
    return response


def with_vhost(settings: RpcSettings, vhost: str, queue_type: protocol.QueueType) -> RpcSettings:
    base = settings.connections.amqp_url.rsplit("/", 1)[0]
    connections = dataclasses.replace(settings.connections, amqp_url=f"{base}/{vhost}")
    return dataclasses.replace(settings, connections=connections,
                               policy=dataclasses.replace(settings.policy, queue_type=queue_type))


def make_vhost(settings: RpcSettings, vhost: str) -> None:
    mgmt(settings, "PUT", f"/vhosts/{vhost}", json={})
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    mgmt(settings, "PUT", f"/permissions/{vhost}/guest", json=everything)


def drop_vhost(settings: RpcSettings, vhost: str) -> None:
    """Delete the vhost and wait until it is gone (deleting 10,000 queues takes the broker a while)."""
    url = f"http://{settings.connections.management_url.split('@')[-1]}/api/vhosts/{vhost}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            if requests.get(url, auth=("guest", "guest"), timeout=60).status_code == 404:
                return
            requests.delete(url, auth=("guest", "guest"), timeout=600)
        except requests.RequestException:
            time.sleep(5)


def broker_memory(settings: RpcSettings, vhost: str) -> dict[str, float]:
    """The node's memory and the vhost's queues' own (read once every queue reported statistics)."""
    deadline = time.monotonic() + 60
    while True:
        queues = mgmt(settings, "GET", f"/queues/{vhost}", params={"columns": "name,memory"}).json()
        if all("memory" in q for q in queues) or time.monotonic() > deadline:
            break
        time.sleep(2)
    node = mgmt(settings, "GET", "/nodes").json()[0]
    return {"node_mb": node["mem_used"] / 1e6, "limit_mb": node["mem_limit"] / 1e6,
            "queues": len(queues), "queues_mb": sum(q.get("memory") or 0 for q in queues) / 1e6}


# -- the phases ------------------------------------------------------------------------------------
def orphan_event(pool: str, vhost: str, keys: list[str], n0: int) -> dict:
    deliveries = [RmqDelivery(b"x" * 100, pika.BasicProperties(
        correlation_id=f"scale.{n0 + i}", message_id=f"m{n0 + i}", delivery_mode=2,
        headers={protocol.KEY_HEADER: key})) for i, key in enumerate(keys)]
    return build_rmq_event(protocol.orphan_queue(pool), vhost, deliveries)


def activity_event(pool: str, vhost: str, keys: list[str]) -> dict:
    deliveries = [RmqDelivery(b"", pika.BasicProperties(headers={
        protocol.KEY_HEADER: key, protocol.EVENT_HEADER: protocol.Event.REQUEST_RECEIVED.value}))
        for key in keys]
    return build_rmq_event(protocol.activity_queue(pool), vhost, deliveries)


def through_handler(function: str, events: list[dict], field: str, expected: int) -> float:
    """Invoke the Lambda function on each event; returns items per second over all of them."""
    handler = load_function(function).lambda_handler
    started = time.perf_counter()
    done = 0
    for event in events:
        done += handler(event, FakeLambdaContext(function, 300_000))[field]
    elapsed = time.perf_counter() - started
    assert done == expected, (function, done, expected)
    return expected / elapsed


def reconciler_passes(plane: ControlPlane, passes: int, cadence: DepthCadence | None) -> dict[str, Any]:
    """``passes`` passes with ``cadence`` (None: the queue listing on every pass)."""
    meter = ManagementMeter()
    walls, cpus = [], []
    errors = skipped = 0
    plane.depth_cadence = cadence  # type: ignore[assignment]
    with plane._lease() as (topology, _):  # the pass's own management session, metered
        topology.management._session.hooks["response"] = [meter.hook]
    trips0, commands0 = Counting.trips, Counting.commands
    groups = 0
    for _ in range(passes):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        outcome = plane.reconcile()
        walls.append((time.perf_counter() - wall0) * 1000)
        cpus.append((time.process_time() - cpu0) * 1000)
        assert not outcome.skipped, outcome
        errors += outcome.queue_errors
        skipped += outcome.depths_skipped
        groups = max(groups, len(outcome.depths))
        if cadence is not None:
            time.sleep(0.2)  # passes a tick apart (the local ticker waits between passes)
    pct = percentiles(walls)
    return {"wall_p50_ms": pct["p50"], "wall_p99_ms": pct["p99"], "wall_max_ms": pct["max"],
            "cpu_ms": statistics.median(cpus),
            "mgmt_kb": meter.bytes / passes / 1000, "mgmt_ms": meter.seconds / passes * 1000,
            "mgmt_requests": meter.requests / passes,
            "redis_trips": (Counting.trips - trips0) / passes,
            "redis_commands": (Counting.commands - commands0) / passes,
            "groups": groups, "failed_passes": errors, "depths_skipped": skipped, "passes": passes}


def call_p50(settings: RpcSettings, pool: str, driver: AnsweringDriver, calls: int) -> float:
    key = "hot-0"
    with PoolTopology(pool, settings) as topology:
        topology.ensure_request_queue(key)
    driver.start(WorkerGroup(pool, key))
    samples = []
    with RpcClient(pool, settings, timeout=30) as client:
        client.call(key, b"warm")
        for _ in range(calls):
            started = time.perf_counter()
            client.call(key, b"x" * 100)
            samples.append((time.perf_counter() - started) * 1000)
    driver.stop(WorkerGroup(pool, key))
    return percentiles(samples)["p50"]


def cold_start_p50(settings: RpcSettings, pool: str, cold_keys: int) -> float:
    driver = AnsweringDriver(settings, serve_prefix="cold-")
    state = redis.Redis.from_url(settings.connections.redis_url)
    driver.running.update(k.decode() for k in state.hkeys(PoolState.key_prefix(pool) + "groups"))
    control = ControlSettings(pool, LONG, reconcile_interval_s=1.0)
    runtime = LocalControlPlane(control, settings, driver).start()
    try:
        with RpcClient(pool, settings, timeout=60) as client:
            samples = [s for s, _ in first_calls(client, [f"cold-{i}" for i in range(cold_keys)])]
    finally:
        runtime.stop()
        services.control_plane.install(None)
    return percentiles(samples)["p50"] * 1000


def measure(size: int, base: RpcSettings, vhost: str, queue_type: protocol.QueueType, passes: int,
            cold_keys: int, calls: int) -> dict[str, Any]:
    settings = with_vhost(base, vhost, queue_type)
    pool = f"scale{uuid.uuid4().hex[:6]}"
    drop_vhost(base, vhost)  # a run that was killed may have left it
    make_vhost(base, vhost)
    redis_client = redis.Redis(connection_pool=redis.ConnectionPool.from_url(
        settings.connections.redis_url, connection_class=CountingConnection))
    driver = AnsweringDriver(settings, serve_prefix="hot-")
    plane = ControlPlane(ControlSettings(pool, LONG), settings, driver=driver, redis_client=redis_client)
    services.control_plane.install(plane)
    row: dict[str, Any] = {"size": size, "queue_type": queue_type.value, "load_before": load_average()}
    try:
        with PoolTopology(pool, settings) as topology:
            topology.declare()
        plane.state.mark_initialized()
        keys = [f"k{n}" for n in range(size)]
        chunks = [keys[i:i + BATCH] for i in range(0, size, BATCH)]
        events = [orphan_event(pool, vhost, chunk, i * BATCH) for i, chunk in enumerate(chunks)]
        row["orphan_new_keys_per_s"] = through_handler("rpc_orphans", events, "new_groups", size)
        row["activity_reports_per_s"] = through_handler(
            "rpc_activity", [activity_event(pool, vhost, c) for c in chunks], "keys", size)
        row["reconciler"] = reconciler_passes(plane, passes, None)
        assert row["reconciler"]["failed_passes"] or row["reconciler"]["groups"] == size, row["reconciler"]
        row["reconciler_cadenced"] = reconciler_passes(plane, passes * 4, DepthCadence())
        row["redis_bytes_per_group"] = (redis_client.memory_usage(plane.state.prefix + "groups") or 0) / size
        row["broker"] = broker_memory(settings, vhost)
        row["call_p50_ms"] = call_p50(settings, pool, driver, calls)
        services.control_plane.install(None)
        row["cold_start_p50_ms"] = cold_start_p50(settings, pool, cold_keys)
        row["load_after"] = load_average()
    finally:
        services.control_plane.install(None)
        plane.close()
        plane.state.clear()
        drop_vhost(base, vhost)
    return row


def busy_load(on: bool) -> subprocess.Popen[bytes] | None:
    """The reproducible "other core busy": one process spinning on core 1 (taskset)."""
    if not on:
        return None
    return subprocess.Popen(["taskset", "-c", BUSY_CORE, sys.executable, "-c", "while True: pass"])


def print_row(row: dict[str, Any]) -> None:
    """One line per size: the row as JSON (the tables in docs/benchmarks.md are made from these)."""
    print(json.dumps(row, default=lambda v: round(v, 2)), flush=True)


def main(argv: list[str] | None = None) -> int:
    quiet_environment()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000], help="keys on the pool")
    parser.add_argument("--queue-type", choices=[t.value for t in protocol.QueueType], default="classic",
                        help="request queue type (10,000 quorum queues may not fit a small broker)")
    parser.add_argument("--passes", type=int, default=20, help="reconciler passes measured per size")
    parser.add_argument("--cold-keys", type=int, default=10, help="new keys timed for the cold start")
    parser.add_argument("--calls", type=int, default=300, help="sequential calls for the call p50")
    parser.add_argument("--busy", action="store_true", help=f"a spinning process pinned to core {BUSY_CORE}")
    parser.add_argument("--vhost", default=DEFAULT_VHOST, help="the vhost made (and deleted) for the run")
    parser.add_argument("--json", type=Path, help="append the rows to this JSON file")
    args = parser.parse_args(argv)
    base = RpcSettings.from_env()
    connect_redis(base.connections).ping()
    spinner = busy_load(args.busy)
    rows = []
    try:
        for size in args.sizes:
            row = measure(size, base, args.vhost, protocol.QueueType(args.queue_type), args.passes,
                          args.cold_keys, args.calls)
            row["mode"] = "busy" if args.busy else "quiet"
            print_row(row)
            rows.append(row)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps(old + rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
