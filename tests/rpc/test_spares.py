"""Warm spares (issue 40): a new key's group adopts a spare worker instead of starting a process,
and the faults around it: a spare killed before or while it adopts a key, two control planes
claiming one spare, the broker going away while spares wait. Real RabbitMQ and Redis (a Redis
Cluster with SWITCHYARD_REDIS_CLUSTER=1: the claim's keys share the pool's hash tag)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from switchyard.core.config import Connections
from switchyard.core.redis_client import RedisClient, connect_redis
from switchyard.rpc.amqp import amqp_urls
from switchyard.rpc.client import RpcClient
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.drivers import SubprocessDriver
from switchyard.rpc.ports import WorkerGroup
from switchyard.rpc.spares import SpareRegistry
from switchyard.rpc.status import pool_figures
from tests.conftest import subprocess_env, wait_for
from tests.pending.tcp_proxy import CuttableProxy
from tests.rpc.conftest import Planes, flush_pool_state

WHOAMI = "tests.rpc.handlers:whoami"
LEAN_COMMAND = (sys.executable, "-m", "switchyard.rpc.worker", "--handler", WHOAMI)


def spare_driver(tmp_path: Path, registry: SpareRegistry, min_spares: int = 1,
                 **env: str) -> SubprocessDriver:
    return SubprocessDriver(LEAN_COMMAND, min_workers=1, max_workers=1, log_dir=tmp_path / "workers",
                            stop_timeout=10, min_spares=min_spares, spares=registry,
                            env=subprocess_env(WORKER_ACTIVITY_INTERVAL="0.2", **env))


def answerer(client: RpcClient, key: str, timeout: float = 30.0) -> str:
    """The worker id that answered ``key``'s call (whoami: ``worker id|key|body``)."""
    response = client.call(key, "hello", timeout=timeout)
    assert response.ok, response
    worker_id, answered_key, body = response.text().split("|", 2)
    assert (answered_key, body) == (key, "hello")
    return worker_id


# -- the worker's imports ----------------------------------------------------------------------
def test_the_worker_and_the_spare_import_only_what_they_run() -> None:
    """Neither the client (its I/O loop), nor the control plane's topology and management API, nor
    the command line: a quarter of a second of every worker start once."""
    def loaded(*modules: str) -> set[str]:
        code = (f"import sys; import {', '.join(modules)}; print(' '.join(sorted(m for m in sys.modules "
                "if m.startswith(('switchyard.', 'requests', 'redis')))))")
        return set(subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True,
                                  text=True, check=True).stdout.split())

    heavy = {"switchyard.rpc.client", "switchyard.rpc.client.io_loop", "switchyard.rpc.control.topology",
             "switchyard.rpc.control.management", "switchyard.cli", "requests"}
    worker = loaded("switchyard.rpc.worker.__main__", "switchyard.rpc.worker.runtime")
    assert "switchyard.rpc.worker.runtime" in worker  # the check sees what it should
    assert worker & (heavy | {"redis"}) == set()  # a worker that is no spare needs no Redis either
    spare = loaded("switchyard.rpc.worker.spare")
    assert "redis" in spare
    assert spare & heavy == set()


# -- the registry: atomic claims ---------------------------------------------------------------
def registry_pool() -> str:
    return f"tspare_{uuid.uuid4().hex[:8]}"


def test_two_control_planes_racing_for_one_spare_exactly_one_wins(redis_client: RedisClient) -> None:
    pool = registry_pool()
    planes = [SpareRegistry(connect_redis(Connections.from_env()), pool) for _ in range(2)]
    try:
        for round_ in range(20):
            planes[0].register(f"spare-{round_}")
            start = threading.Barrier(2)
            won: list[str | None] = [None, None]

            def claim(i: int, round_: int, start: threading.Barrier, won: list[str | None]) -> None:
                start.wait()
                won[i] = planes[i].claim_any(f"key-{round_}-{i}")

            threads = [threading.Thread(target=claim, args=(i, round_, start, won)) for i in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(10)
            assert sorted(w is not None for w in won) == [False, True], won  # exactly one winner
            winner = next(i for i, w in enumerate(won) if w is not None)
            # The spare got the winner's key, and only that one.
            assert planes[0].wait(f"spare-{round_}", 1) == f"key-{round_}-{winner}"
            assert planes[0].wait(f"spare-{round_}", 0.1) is None
    finally:
        flush_pool_state(redis_client, pool)
        for plane in planes:
            plane.redis.close()


def test_a_withdrawn_spare_cannot_be_claimed_and_a_claimed_one_keeps_its_key(
        redis_client: RedisClient) -> None:
    pool = registry_pool()
    registry = SpareRegistry(redis_client, pool)
    try:
        registry.register("a")
        assert registry.withdraw("a") is None
        assert not registry.claim("a", "k")
        registry.register("b")
        assert registry.claim("b", "k2")
        assert not registry.claim("b", "k3")  # claimed: out of the set
        assert registry.withdraw("b") == "k2"  # stopping after the claim: it learns which key it had
        assert registry.waiting() == set()
    finally:
        flush_pool_state(redis_client, pool)


def test_the_cli_worker_started_as_a_spare_waits_for_a_key(redis_client: RedisClient) -> None:
    """``switchyard worker`` is the ECS task's command: with WORKER_SPARE=1 and no key it is a spare
    (registers, waits), and SIGTERM withdraws it."""
    pool = registry_pool()
    registry = SpareRegistry(redis_client, pool)
    worker_id = f"{pool}-spare-cli"
    proc = subprocess.Popen([sys.executable, "-m", "switchyard", "worker", "--handler", WHOAMI],
                            env=subprocess_env(WORKER_SPARE="1", WORKER_ID=worker_id, WORKER_POOL=pool),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: registry.is_waiting(worker_id) or proc.poll() is not None, timeout=30,
                 what="the CLI spare registered")
        assert proc.poll() is None, proc.communicate()[0].decode()
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode()
        assert proc.returncode == 0, output
        assert "waiting for a key" in output
        assert not registry.is_waiting(worker_id)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        flush_pool_state(redis_client, pool)


# -- the driver and the control plane ---------------------------------------------------------------
def test_a_new_key_is_served_by_a_spare_and_a_new_spare_takes_its_place(make_pool, planes: Planes,
                                                                          redis_client: RedisClient,
                                                                          tmp_path: Path) -> None:
    pool, settings = make_pool()
    registry = SpareRegistry(redis_client, pool)
    driver = spare_driver(tmp_path, registry)
    planes.start(pool, settings, driver=driver)
    first = wait_for(registry.waiting, timeout=30, what="a spare registered")
    with PoolTopology(pool, settings) as topology:  # `switchyard status` counts it
        assert pool_figures(pool, redis_client, topology.management).spares == 1
    with RpcClient(pool, settings) as client:
        assert answerer(client, "k1") == next(iter(first))  # the spare answered, as the group's worker
        assert [p.worker_id for p in driver.workers(WorkerGroup(pool, "k1"))] == list(first)
        second = wait_for(lambda: registry.waiting() - first, timeout=30, what="a new spare registered")
        assert answerer(client, "k2") == next(iter(second))
        assert answerer(client, "k1") == next(iter(first))  # still the same group: one worker, one key


def test_a_spare_killed_before_it_adopts_a_key_is_passed_over(make_pool, planes: Planes,
                                                              redis_client: RedisClient,
                                                              tmp_path: Path) -> None:
    pool, settings = make_pool()
    registry = SpareRegistry(redis_client, pool)
    driver = spare_driver(tmp_path, registry)
    planes.start(pool, settings, driver=driver)
    (dead,) = wait_for(registry.waiting, timeout=30, what="a spare registered")
    (proc,) = driver.waiting_spares()
    os.kill(proc.pid, signal.SIGKILL)
    proc.process.wait(10)
    with RpcClient(pool, settings) as client:
        assert answerer(client, "k") != dead  # a normal start, or the spare that replaced it
    wait_for(lambda: dead not in registry.waiting(), timeout=10, what="the dead spare forgotten")


def test_a_spare_killed_while_it_adopts_a_key_still_gets_the_key_served(make_pool, planes: Planes,
                                                                       redis_client: RedisClient,
                                                                       tmp_path: Path) -> None:
    pool, settings = make_pool()
    registry = SpareRegistry(redis_client, pool)
    driver = spare_driver(tmp_path, registry)
    planes.start(pool, settings, driver=driver)
    (spare,) = wait_for(registry.waiting, timeout=30, what="a spare registered")
    driver.start(WorkerGroup(pool, "k"))  # the claim: the key is pushed to the spare
    (adopted,) = driver.workers(WorkerGroup(pool, "k"))
    assert adopted.worker_id == spare
    os.kill(adopted.pid, signal.SIGKILL)  # before or just as it consumes the key's queue
    adopted.process.wait(10)
    with RpcClient(pool, settings) as client:
        assert answerer(client, "k") != spare  # the reconciler started the group again


def test_spares_waiting_through_a_broker_outage_still_adopt_keys(make_pool, planes: Planes,
                                                                redis_client: RedisClient,
                                                                tmp_path: Path) -> None:
    """The spares' connections go through a proxy that drops them all and refuses new ones for a
    while, as a broker restart does: the spare connects again and serves its key afterwards."""
    pool, settings = make_pool()
    url = amqp_urls(settings.connections.amqp_url)[0]  # one node of a cluster is enough
    proxy = CuttableProxy(urlsplit(url).port or 5672)
    try:
        registry = SpareRegistry(redis_client, pool)
        driver = spare_driver(tmp_path, registry, SWITCHYARD_AMQP_URL=proxy.through(url))
        planes.start(pool, settings, driver=driver)
        (spare,) = wait_for(registry.waiting, timeout=30, what="a spare registered")
        wait_for(lambda: proxy._links, timeout=10, what="the spare's connection through the proxy")
        proxy.cut(3.0)  # every connection through it closed; new ones refused for 3 s
        wait_for(lambda: not proxy._links, timeout=10, what="the cut")
        # The spare connects again once the broker is back, still waiting (still the same spare).
        wait_for(lambda: proxy._links, timeout=30, what="the spare connected again")
        assert registry.waiting() == {spare}
        with RpcClient(pool, settings) as client:
            assert answerer(client, "k", timeout=60) == spare
    finally:
        proxy.close()


def test_a_spare_rejoins_a_set_redis_lost_and_never_after_a_claim(make_pool, planes: Planes,
                                                                 redis_client: RedisClient,
                                                                 tmp_path: Path) -> None:
    pool, settings = make_pool()
    registry = SpareRegistry(redis_client, pool)
    planes.start(pool, settings, driver=spare_driver(tmp_path, registry))
    (spare,) = wait_for(registry.waiting, timeout=30, what="a spare registered")
    redis_client.delete(registry.prefix + "spares")  # as a flushed or failed-over Redis would
    assert wait_for(registry.waiting, timeout=10, what="the spare back in the set") == {spare}
    with RpcClient(pool, settings) as client:
        assert answerer(client, "k") == spare
    registry.register("claimed-elsewhere")
    assert registry.claim("claimed-elsewhere", "k2")
    assert not registry.rejoin("claimed-elsewhere")  # its key is on its list: not claimable again
    assert "claimed-elsewhere" not in registry.waiting()
