"""RPC fixtures: throwaway pools on the real RabbitMQ, and workers as real subprocesses."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pika
import pytest

from switchyard.rpc import protocol as p
from switchyard.rpc.management import ManagementApi
from switchyard.rpc.settings import PoolPolicy, RpcSettings
from switchyard.rpc.topology import PoolTopology
from tests.conftest import subprocess_env, unique


def delete_pool(settings: RpcSettings, pool: str) -> None:
    """Remove every queue, exchange and policy of a test pool."""
    api = ManagementApi(settings.connections.management_url)
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    try:
        for queue in api.list_queues(f"^{pool}-", columns="name"):
            connection.channel().queue_delete(queue["name"])
        for exchange in (p.req_exchange(pool), p.orphan_exchange(pool), p.dl_exchange(pool),
                         p.activity_exchange(pool)):
            connection.channel().exchange_delete(exchange)
    finally:
        connection.close()
    api.delete_policy(p.request_policy_name(pool))
    api.delete_policy(p.pool_queues_policy_name(pool))


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
            WORKER_REQUESTS_QUEUE=p.request_queue(pool, key),
            WORKER_ACTIVITY_EXCHANGE=p.activity_exchange(pool),
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
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if connection.channel().queue_declare(queue, passive=True).method.consumer_count >= consumers:
                    return
                for proc in self.procs:
                    if proc.poll() is not None and proc.returncode not in (0, -15):
                        error = proc.stderr.read().decode()
                        raise AssertionError(f"worker exited {proc.returncode}: {error}")
                time.sleep(0.05)
        finally:
            connection.close()
        raise AssertionError(f"{queue} did not reach {consumers} consumers in {timeout}s")

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


def get_message(settings: RpcSettings, queue: str, timeout: float = 10.0):
    """Poll ``queue`` with basic.get until a message arrives; returns (method, props, body) or None."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    try:
        channel = connection.channel()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is not None:
                return method, props, body
            time.sleep(0.05)
        return None
    finally:
        connection.close()
