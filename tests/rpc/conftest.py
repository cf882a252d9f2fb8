"""RPC fixtures: throwaway pools on the real RabbitMQ, and workers as real subprocesses."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from switchyard.core.config import Connections
from switchyard.core.redis_client import RedisClient, connect_redis
from switchyard.local.rpc_runtime import BridgeSettings, LocalControlPlane
from switchyard.rpc import protocol
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.drivers import SubprocessDriver, WorkerGroup
from switchyard.rpc.settings import ControlSettings, Delays, PoolPolicy, RpcSettings
from switchyard.rpc.store import PoolState
from tests.conftest import subprocess_env, unique, wait_for


def delete_pool(settings: RpcSettings, pool: str) -> None:
    """Remove every queue, exchange and policy of a test pool."""
    with PoolTopology(pool, settings) as topology:
        topology.delete(force=True)


PoolFactory = Callable[..., tuple[str, RpcSettings]]


@pytest.fixture
def make_pool() -> Iterator[PoolFactory]:
    """``make_pool(**policy)`` declares a fresh pool and returns ``(pool, settings)``."""
    created: list[tuple[str, RpcSettings]] = []

    def factory(**policy: object) -> tuple[str, RpcSettings]:
        base = RpcSettings.from_env()
        settings = RpcSettings(**{**vars(base), "policy": PoolPolicy(**{**vars(base.policy), **policy})})
        pool = unique("t")
        with PoolTopology(pool, settings) as topology:
            topology.declare()
        created.append((pool, settings))
        return pool, settings

    yield factory
    for pool, settings in created:
        delete_pool(settings, pool)


@pytest.fixture
def pool(make_pool: PoolFactory) -> tuple[str, RpcSettings]:
    return make_pool()


class WorkerProcesses:
    """Starts ``switchyard worker`` subprocesses exactly as a worker group driver would."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, pool: str, key: str, handler: str, worker_id: str | None = None,
              **env: str) -> subprocess.Popen:
        child_env = subprocess_env(
            WORKER_POOL=pool,
            WORKER_KEY=key,
            WORKER_ID=worker_id or unique("w"),
            WORKER_REQUESTS_QUEUE=protocol.request_queue(pool, key),
            WORKER_ACTIVITY_EXCHANGE=protocol.activity_exchange(pool),
            **env,
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "switchyard", "worker", "--handler", handler],
            env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self.procs.append(proc)
        return proc

    def wait_consuming(
        self, settings: RpcSettings, queue: str, consumers: int = 1, timeout: float = 15
    ) -> None:
        """Block until ``queue`` has ``consumers`` consumers (passive declare is exact and immediate)."""
        connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))

        def consuming() -> bool:
            if connection.channel().queue_declare(queue, passive=True).method.consumer_count >= consumers:
                return True
            for proc in self.procs:
                if proc.poll() is not None and proc.returncode not in (0, -15):
                    error = proc.stderr.read().decode()
                    raise AssertionError(f"worker exited {proc.returncode}: {error}")
            return False

        try:
            wait_for(consuming, timeout, interval=0.05, what=f"{queue} to reach {consumers} consumers")
        finally:
            connection.close()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def workers() -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses()
    yield procs
    procs.stop_all()


def drain(channel, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
    """Every message in ``queue`` now, taken (a plain client's read of a reply or poison queue)."""
    got = []
    while True:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((props, body))


def ready_count(settings: RpcSettings, queue: str) -> int:
    """Messages in ``queue`` not yet delivered to a consumer (passive declare: exact and immediate)."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def get_message(settings: RpcSettings, queue: str, timeout: float = 10.0, keep: bool = False):
    """Poll ``queue`` with basic.get until a message arrives; returns (method, props, body) or None.
    ``keep``: the message is put back (nacked with requeue) instead of taken."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    try:
        channel = connection.channel()

        def got():
            method, props, body = channel.basic_get(queue, auto_ack=not keep)
            if method is not None and keep:
                channel.basic_nack(method.delivery_tag, requeue=True)
            return method is not None and (method, props, body)

        return wait_for(got, timeout, interval=0.05, required=False) or None
    finally:
        connection.close()


# -- control plane --------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _quiet_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Powertools would print an EMF blob per handler invocation; these tests read outcomes.

    Scoped to the RPC tests: the delay tests read the EMF output.
    """
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")

WORKER_COMMAND = (sys.executable, "-m", "switchyard", "worker", "--handler")


def state_prefix(pool: str) -> str:
    return PoolState.key_prefix(pool)


def flush_pool_state(client: RedisClient, pool: str) -> int:
    """Delete every Redis key of ``pool``'s state; returns how many there were."""
    keys = list(client.scan_iter(match=state_prefix(pool) + "*", count=1000))
    if keys:
        client.delete(*keys)
    return len(keys)


@pytest.fixture
def redis_client() -> Iterator[RedisClient]:
    """The Redis of the tests: SWITCHYARD_REDIS_URL (with SWITCHYARD_REDIS_CLUSTER=1, a cluster)."""
    client = connect_redis(Connections.from_env())
    yield client
    client.close()


class CountingDriver(SubprocessDriver):
    """The real subprocess driver, counting the starts that actually spawned workers."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.spawns: dict[str, int] = {}
        self.spawned: dict[WorkerGroup, list] = {}

    def _spawn(self, group: WorkerGroup):
        proc = super()._spawn(group)
        self.spawns[group.key] = self.spawns.get(group.key, 0) + 1
        self.spawned.setdefault(group, []).append(proc)
        return proc

    def crashes(self) -> dict[WorkerGroup, int]:
        """Workers per group that exited on their own with a failure code (the driver restarts those)."""
        counts = {group: sum(proc.process.poll() not in (None, 0, -signal.SIGTERM) for proc in procs)
                  for group, procs in self.spawned.items()}
        return {group: n for group, n in counts.items() if n}

    def crash_logs(self, limit: int = 2000) -> str:
        """The tail of each crashed group's log, so a failing assertion says why the workers died."""
        return "\n".join(f"--- {group.key}:\n" + (self.log_dir / f"{group.group_id}.log")
                         .read_text(errors="replace")[-limit:] for group in self.crashes())


def worker_driver(tmp_path: Path, handler: str, *, max_workers: int = 1, **env: str) -> CountingDriver:
    return CountingDriver([*WORKER_COMMAND, handler], min_workers=1, max_workers=max_workers,
                          log_dir=tmp_path / "workers", stop_timeout=10,
                          env=subprocess_env(**{"WORKER_ACTIVITY_INTERVAL": "0.2", **env}))


class Planes:
    """Starts ``LocalControlPlane``s for test pools; stops them (and their workers) and wipes the
    pools' Redis state afterwards."""

    def __init__(self, tmp_path: Path, redis_client: RedisClient) -> None:
        self.tmp_path = tmp_path
        self.redis = redis_client
        self.started: list[LocalControlPlane] = []
        self.pools: list[str] = []

    def start(self, pool: str, settings: RpcSettings, *, handler: str = "tests.rpc.handlers:whoami",
              unbind_s: float = 30.0, stop_s: float = 30.0, interval_s: float = 0.2,
              max_workers: int = 1, driver: SubprocessDriver | None = None,
              worker_env: dict[str, str] | None = None) -> LocalControlPlane:
        self.pools.append(pool)
        driver = driver or worker_driver(self.tmp_path, handler, max_workers=max_workers,
                                         **(worker_env or {}))
        plane = LocalControlPlane(ControlSettings(pool, Delays(unbind_s, stop_s), interval_s), settings,
                                  driver, BridgeSettings(window_s=0.02))
        self.started.append(plane)
        return plane.start()

    def close(self) -> None:
        for plane in reversed(self.started):
            plane.stop()
        for pool in self.pools:
            flush_pool_state(self.redis, pool)


@pytest.fixture
def planes(tmp_path: Path, redis_client: RedisClient) -> Iterator[Planes]:
    planes = Planes(tmp_path, redis_client)
    yield planes
    planes.close()
