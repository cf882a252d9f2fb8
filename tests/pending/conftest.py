"""Pending-queue fixtures: nodes on the shared Redis under a unique prefix, a private redis-server
for the fault tests (flushes, cut connections, crashes never touch the shared one), a TCP proxy."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from switchyard.core.config import Connections
from switchyard.core.redis_client import RedisClient, connect_redis
from switchyard.pending import PendingQueue
from switchyard.pending.settings import PendingSettings
from tests.conftest import unique, wait_for

# Fast timings: heartbeats every 0.2 s, a silent processor is lost after 1 s, a silent caller
# after 1.5 s, data loss checked every 0.3 s. Seed 002's defaults are tested in test_settings.
FAST = dict(heartbeat_interval_s=0.2, heartbeat_initial_delay_s=0.1, processor_timeout_s=1.0,
            sender_timeout_s=1.5, data_loss_check_s=0.3, pickup_timeout_s=5.0, poll_wait_s=1.0,
            http_poll_wait_s=1.0,
            retry_interval_s=0.5, retry_window_s=30.0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def keys_without_ttl(client: RedisClient, prefix: str) -> list[str]:
    """Keys under ``prefix`` that would live forever (the invariant every script keeps)."""
    return [k.decode() for k in client.scan_iter(match=f"{prefix}:*", count=1000) if client.pttl(k) == -1]


def ownerless_requests(client: RedisClient, prefix: str) -> list[str]:
    """Requests nobody will ever move on: queued but neither in their endpoint's pending list nor
    in a take key (popped by a poller, not yet claimed: the caller watches it), or taken with no
    processor recorded. (Answered ones belong to their caller until the TTL.)"""
    problems = []
    for key in client.scan_iter(match=f"{prefix}:{{*}}:r:*", count=1000):
        text = key.decode()
        state, proc = client.hmget(key, "s", "proc")
        tag, _, request_id = text.rpartition(":r:")
        held = [element.split(b" ", 1)[0] for name in client.scan_iter(match=f"{tag}:t:*")
                for element in client.lrange(name, 0, -1)]
        waiting = [element.split(b" ", 1)[0] for element in client.lrange(f"{tag}:pending", 0, -1)]
        if state == b"q" and request_id.encode() not in waiting + held:
            problems.append(f"{text}: queued but neither in the pending list nor in a take key")
        if state == b"t" and not proc:
            problems.append(f"{text}: taken by no processor")
    return problems


@pytest.fixture
def settings() -> PendingSettings:
    """On SWITCHYARD_REDIS_URL: the same suites run on a Redis Cluster with SWITCHYARD_REDIS_CLUSTER=1."""
    return PendingSettings(prefix=unique("pq"), connections=Connections.from_env(), **FAST)  # type: ignore[arg-type]


@pytest.fixture
def shared_redis(settings: PendingSettings) -> Iterator[RedisClient]:
    """The Redis of the tests: SWITCHYARD_REDIS_URL (with SWITCHYARD_REDIS_CLUSTER=1, a cluster)."""
    client = connect_redis(settings.connections)
    yield client
    for key in client.scan_iter(match=f"{settings.prefix}:*", count=1000):
        client.unlink(key)
    client.close()


NodeFactory = Callable[..., PendingQueue]


@pytest.fixture
def make_node(settings: PendingSettings, shared_redis: RedisClient) -> Iterator[NodeFactory]:
    """``make_node(**overrides)``: a started node (PendingQueue) on the test's settings."""
    nodes: list[PendingQueue] = []

    def make(**overrides: object) -> PendingQueue:
        node = PendingQueue(replace(settings, **overrides)).start()  # type: ignore[arg-type]
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


class PrivateRedis:
    """A redis-server of our own (no persistence, like seed 002's setup), restartable."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (./dev services installs it)")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--maxclients", "10000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        wait_for(client.ping, interval=0.05, ignoring=redis.ConnectionError, what=f"Redis on {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


@pytest.fixture(scope="session")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


def private_settings(server: PrivateRedis, url: str | None = None, **overrides: object) -> PendingSettings:
    """Test settings pointing at the private Redis (or at ``url``, e.g. a proxy in front of it)."""
    connections = Connections(redis_url=url or server.url, redis_timeout_s=2.0)
    return PendingSettings(prefix=unique("pq"), connections=connections, **{**FAST, **overrides})  # type: ignore[arg-type]
