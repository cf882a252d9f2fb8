"""The pending queue on a Redis Cluster (SWITCHYARD_REDIS_CLUSTER=1, SWITCHYARD_REDIS_URL naming a
node; e.g. `SWITCHYARD_REDIS_CLUSTER_SERVICE=1 ./dev services` starts one on 7100-7105): a master
killed under traffic, a shard that lost its data; skipped on a single Redis. The command count of
combined calls runs on a private cluster of its own (the shared one's counts are everyone's)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from redis.cluster import ClusterNode, RedisCluster

from switchyard.core.config import Connections
from switchyard.core.redis_client import RedisClient
from switchyard.pending import DataLossError, PendingError, PendingQueue, PendingSettings
from tests.conftest import unique, wait_for
from tests.pending.conftest import FAST, NodeFactory, keys_without_ttl, ownerless_requests
from tests.pending.test_queue import serve
from tests.redis_cluster import PrivateRedisCluster


@pytest.fixture
def cluster(shared_redis: RedisClient, settings: PendingSettings) -> RedisCluster:
    if not isinstance(shared_redis, RedisCluster):
        pytest.skip("needs a Redis Cluster: SWITCHYARD_REDIS_CLUSTER=1 SWITCHYARD_REDIS_URL=redis://<a node>")
    return shared_redis


def master_of(cluster: RedisCluster, tag: str) -> ClusterNode:
    cluster.nodes_manager.initialize()
    return cluster.get_node_from_key(tag)


def replicated(node: ClusterNode) -> bool:
    """``node`` is a master with a replica online (so it can fail over)."""
    info = node.redis_connection.info("replication")
    return info.get("role") == "master" and info.get("slave0", {}).get("state") == "online"


def restart_command(node: ClusterNode) -> list[str]:
    """The redis-server command that starts ``node`` again as it runs now (its nodes.conf kept:
    it rejoins the cluster as a replica). Its process title no longer holds its arguments."""
    config = node.redis_connection.config_get("*")
    keep = ("port", "bind", "dir", "logfile", "pidfile", "cluster-config-file", "cluster-node-timeout",
            "daemonize", "save", "appendonly", "cluster-enabled")
    command = [shutil.which("redis-server") or "redis-server"]
    for name in keep:
        command += [f"--{name}", *(config[name].split() or [""])]
    return command


def call_loop(caller: Any, endpoint: str, stop: threading.Event, outcomes: list[Any], base: int) -> None:
    """Calls one after another until ``stop``; each outcome is (sent, answer) or (sent, exception)."""
    n = base
    while not stop.is_set():
        try:
            outcomes.append((n, caller.queue_and_wait(endpoint, n).body))
        except Exception as exc:  # every kind is recorded: the test checks which
            outcomes.append((n, exc))
        n += 1


def test_a_killed_master_loses_no_call_silently(make_node: NodeFactory, cluster: RedisCluster,
                                                settings: PendingSettings) -> None:
    """SIGKILL the master holding an endpoint's keys while calls run: its replica takes over (the
    cluster's node timeout), and every call either got its own answer or failed with the part's
    error (PendingError); none hangs, none gets another's answer, no key is left without a TTL or
    a request without an owner. The replica had the guard (set when the nodes started), so the
    nodes report no data loss; the calls go on on the promoted replica."""
    # Not on the node SWITCHYARD_REDIS_URL names: a client starting meanwhile would find no cluster
    # (in production the URL is ElastiCache's configuration endpoint, which stays up).
    named = settings.connections.redis_url.rsplit(":", 1)[-1].split("/")[0]
    endpoint = next(e for e in (f"failover{i}" for i in range(1000))
                    if str(master_of(cluster, f"{{{e}}}").port) != named)
    caller, processor = make_node(), make_node()
    stop_serving = serve(processor, endpoint, lambda body: body, pollers=4)
    stop, outcomes = threading.Event(), []
    threads = [threading.Thread(target=call_loop, args=(caller, endpoint, stop, outcomes, t * 1_000_000),
                                daemon=True) for t in range(4)]
    for thread in threads:
        thread.start()
    master = master_of(cluster, f"{{{endpoint}}}")
    wait_for(lambda: replicated(master), timeout=30, what=f"a replica of {master.name} online")
    pid = int(master.redis_connection.info("server")["process_id"])
    command = restart_command(master)
    try:
        wait_for(lambda: len(outcomes) >= 50, what="50 calls before the kill")
        os.kill(pid, signal.SIGKILL)
        before = len(outcomes)
        wait_for(lambda: master_of(cluster, f"{{{endpoint}}}").name != master.name, timeout=30,
                 what=f"the promotion of {master.name}'s replica")
        wait_for(lambda: sum(isinstance(o[1], int) for o in outcomes[before:]) >= 50, timeout=60,
                 what="50 answered calls after the failover")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        stop_serving.set()
        # The killed node back (its nodes.conf makes it a replica of the promoted one).
        subprocess.run(command, check=True)
    assert not any(thread.is_alive() for thread in threads), "a call hung"
    wrong = [(n, o) for n, o in outcomes if not (o == n or isinstance(o, PendingError))]
    assert wrong == [], f"calls with another's answer or an unexpected error: {wrong[:5]}"
    failed = [o for _, o in outcomes if isinstance(o, PendingError)]
    assert caller.data_loss_events == processor.data_loss_events == 0
    assert keys_without_ttl(cluster, settings.prefix) == []
    assert ownerless_requests(cluster, settings.prefix) == []
    reasons = sorted({f"{type(e).__name__}: {e}" for e in failed})
    print(f"{len(outcomes)} calls, {len(failed)} failed: {reasons}; "
          f"data-loss events: caller {caller.data_loss_events}, processor {processor.data_loss_events}")
    # The restarted node an online replica again (the next failover needs one).
    wait_for(lambda: replicated(master_of(cluster, f"{{{endpoint}}}")), timeout=30,
             what=f"{master.name} back as a replica")


def test_a_shard_that_lost_its_data_fails_only_its_endpoints_calls(
        make_node: NodeFactory, cluster: RedisCluster) -> None:
    """A master flushed (a restart without persistence): the node's guard on that shard is gone,
    so the calls in flight to endpoints whose keys live there fail with DataLossError, while an
    endpoint on another shard is untouched."""
    cluster.nodes_manager.initialize()
    lost_master = master_of(cluster, "{lost}")
    other = next(e for e in (f"kept{i}" for i in range(1000))
                 if master_of(cluster, f"{{{e}}}").name != lost_master.name)
    caller = make_node()
    outcomes: dict[str, Any] = {}

    def call(endpoint: str) -> None:
        try:
            outcomes[endpoint] = caller.queue_and_wait(endpoint, 1, pickup_timeout=30)
        except PendingError as exc:
            outcomes[endpoint] = exc

    threads = [threading.Thread(target=call, args=(e,), daemon=True) for e in ("lost", other)]
    for thread in threads:
        thread.start()
    wait_for(lambda: cluster.llen(caller.pending_key("lost")) == 1 == cluster.llen(caller.pending_key(other)),
             what="both requests queued")
    lost_master.redis_connection.flushall()
    threads[0].join(10)
    assert isinstance(outcomes.get("lost"), DataLossError), outcomes
    assert caller.data_loss_events == 1
    assert other not in outcomes  # still waiting for its processor
    processor = make_node()
    request = processor.dequeue(other, 5)
    assert request is not None
    processor.apply_response(request, "still here")
    threads[1].join(10)
    assert getattr(outcomes[other], "body", outcomes[other]) == "still here"


@pytest.fixture(scope="module")
def private_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedisCluster]:
    with PrivateRedisCluster(Path(tmp_path_factory.mktemp("cluster")), replicas=0) as cluster:
        yield cluster


def commandstats(cluster: PrivateRedisCluster) -> Counter[str]:
    counts: Counter[str] = Counter()
    with cluster.client() as client:
        for node in client.get_primaries():
            stats = node.redis_connection.info("commandstats")
            counts.update({name: command["calls"] for name, command in stats.items()})
    return counts


def test_combined_calls_ask_no_server_for_their_keys(private_cluster: PrivateRedisCluster) -> None:
    """Scripts of concurrent calls combined in one cluster pipeline are routed by the client's slot
    map, not by asking a server for each EVALSHA's keys (COMMAND GETKEYS, an extra round trip per
    call: up to 2.6x the CPU of a call on a single server, bench/cluster_bench.py)."""
    connections = Connections(redis_url=private_cluster.url, redis_cluster=True)
    settings = PendingSettings(prefix=unique("pq"), connections=connections, **FAST)  # type: ignore[arg-type]
    with PendingQueue(settings) as caller, PendingQueue(settings) as service:
        stop = serve(service, "combined", lambda body: body, pollers=8)
        before = commandstats(private_cluster)
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda n: caller.queue_and_wait("combined", n).body, range(400)))
        stop.set()
        batch = caller.redis_store.batch
        assert batch.round_trips < batch.calls, "no enqueues were combined: the test saw no pipeline"
    assert answers == list(range(400))
    ran = commandstats(private_cluster) - before
    assert ran["cmdstat_evalsha"] >= 800  # every call's enqueue and respond
    assert ran["cmdstat_command|getkeys"] == 0, ran
