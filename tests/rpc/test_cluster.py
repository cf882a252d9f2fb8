"""Switchyard on a three-node RabbitMQ 4.0 cluster (scripts/rabbitmq-cluster.sh, Amazon MQ's
CLUSTER_MULTI_AZ locally): where new queues' leaders go, how many members they get, the
dead-lettering probe on every node, and a queue whose members' nodes are down.

The cluster is the one on SWITCHYARD_RABBITMQ_CLUSTER_PORT (default 5680), started here if it does
not answer; every test talks to node 1, as a client behind one endpoint would. The tests strand and
stop nodes of it and leave all three running.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pika
import pytest
import requests

from switchyard.core.redis_client import connect_redis
from switchyard.rpc import protocol
from switchyard.rpc.control.leaderless import LeaderlessWatch
from switchyard.rpc.control.management import ManagementApi
from switchyard.rpc.control.reconciler import Reconciler
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.drivers.noop import NoopDriver
from switchyard.rpc.settings import Delays, RpcSettings
from switchyard.rpc.store import PoolState
from tests.conftest import unique, wait_for
from tests.rpc import cluster
from tests.rpc.conftest import delete_pool

DLX_SUP = "supervisor:{}(rabbit_sup, rabbit_fifo_dlx_sup)."


@dataclass(frozen=True)
class Cluster:
    settings: RpcSettings  # node 1's AMQP and management URLs
    nodes: list[str]  # node N's name at N - 1

    def api(self) -> ManagementApi:
        return ManagementApi(self.settings.connections.management_url)

    def leaders(self) -> Counter[str]:
        """Quorum queues led by each node, every vhost."""
        listed = requests.get(f"{cluster.management_url(1)}/api/queues", params={"columns": "type,leader"},
                              timeout=30).json()
        counts = Counter({node: 0 for node in self.nodes})
        counts.update(q["leader"] for q in listed if q.get("type") == "quorum" and q.get("leader"))
        return counts


@pytest.fixture(scope="module")
def on_cluster() -> Iterator[Cluster]:
    cluster.ensure_running()
    nodes = [requests.get(f"{cluster.management_url(n)}/api/overview", timeout=10).json()["node"]
             for n in cluster.NODES]
    yield Cluster(RpcSettings(connections=cluster.connections(cluster.node_url(1))), nodes)
    cluster.ensure_running()


@pytest.fixture
def cluster_pool(on_cluster: Cluster) -> Iterator[list[tuple[str, RpcSettings]]]:
    """Pools a test declares on the cluster (appended as ``(pool, settings)``), deleted after it."""
    pools: list[tuple[str, RpcSettings]] = []
    yield pools
    for pool, settings in pools:
        delete_pool(settings, pool)


def declared(pools: list[tuple[str, RpcSettings]], settings: RpcSettings, keys: list[str]) -> str:
    pool = unique("cl")
    pools.append((pool, settings))
    with PoolTopology(pool, settings) as topology:
        topology.declare()
        topology.ensure_request_queues(keys, likely_new=keys, parallel=1)  # one connection
    return pool


def test_queues_declared_on_one_connection_are_led_by_every_node(on_cluster: Cluster, cluster_pool) -> None:
    """Before, every leader was on the node of the declaring connection. ``balanced`` gives each new
    queue to the node leading the fewest: past the cluster's present imbalance, every node gets some."""
    before = on_cluster.leaders()
    behind = sum(max(before.values()) - count for count in before.values())
    pool = declared(cluster_pool, on_cluster.settings, [f"k{i}" for i in range(behind + 6)])
    queues = on_cluster.api().list_queues(f"^{pool}-", columns="name,type,leader,members")
    led = Counter(q["leader"] for q in queues if q["name"].startswith(protocol.request_queue_prefix(pool)))
    assert set(led) == set(on_cluster.nodes), f"leaders {dict(led)}, the cluster's before {dict(before)}"
    quorum = [q for q in queues if q["type"] == "quorum"]
    assert quorum and all(sorted(q["members"]) == sorted(on_cluster.nodes) for q in quorum)


def test_new_quorum_queues_get_the_initial_group_size_of_the_settings(on_cluster: Cluster,
                                                                      cluster_pool) -> None:
    settings = replace(on_cluster.settings, policy=replace(on_cluster.settings.policy, initial_group_size=2))
    pool = declared(cluster_pool, settings, ["k"])
    quorum = [q for q in on_cluster.api().list_queues(f"^{pool}-", columns="name,type,members")
              if q["type"] == "quorum"]
    assert (len(quorum) == len(protocol.pool_queue_names(pool)) + 1
            and {len(q["members"]) for q in quorum} == {2})


@pytest.mark.parametrize("node", [1, 2], ids=["the node the probe reached", "another node"])
def test_the_probe_finds_the_stranded_node(on_cluster: Cluster, node: int) -> None:
    """The probe runs on node 1's connection and management API; the supervisor stopped on ``node``
    (what #16652 leaves: ``whereis(rabbit_fifo_dlx_sup)`` undefined, an at-least-once queue led
    there cannot start)."""
    stranded = on_cluster.nodes[node - 1]
    cluster.ctl(node, "eval", DLX_SUP.format("terminate_child"))
    try:
        with PoolTopology(unique("cl"), on_cluster.settings) as topology:
            result = topology.probe_dead_lettering()
        assert result.stranded and result.nodes == (stranded,)
        assert stranded in result.detail and "reboot" in result.detail.lower()
        assert on_cluster.api().list_queues(f"^{protocol.DEAD_LETTER_PROBE_PREFIX}") == []
    finally:
        cluster.ctl(node, "eval", DLX_SUP.format("restart_child"))
    assert cluster.heal_dead_lettering() == "running"
    with PoolTopology(unique("cl"), on_cluster.settings) as topology:
        assert not topology.probe_dead_lettering().stranded


def test_a_queue_whose_members_nodes_are_down_is_reported_and_kept(on_cluster: Cluster, cluster_pool) -> None:
    """Two members (node 1 and one other); the other's node stops. The queue cannot elect a leader,
    but it is not lost: the watch reports it as waiting, the reconciler keeps it, and it comes back
    with its request when the node does. (Two of three nodes down pauses the third too.)"""
    settings = replace(on_cluster.settings, policy=replace(on_cluster.settings.policy, initial_group_size=2))
    pool = declared(cluster_pool, settings, ["k"])
    queue = protocol.request_queue(pool, "k")
    with pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"kept", pika.BasicProperties(delivery_mode=2))
    members = on_cluster.api().get_queue(queue)["members"]
    other = next(n for n, node in enumerate(on_cluster.nodes, 1) if node in members and n != 1)
    state = PoolState(connect_redis(settings.connections), pool)
    with PoolTopology(pool, settings) as topology:
        reconciler = Reconciler(state, topology, NoopDriver(), Delays(),
                                leaderless=LeaderlessWatch(silent_s=1.0, probe_timeout_s=2.0))
        reconciler.run_pass()
        cluster.stop_node(other)
        try:
            outcomes = []
            wait_for(lambda: outcomes.append(reconciler.run_pass()) or outcomes[-1].leaderless_waiting,
                     timeout=60, interval=0.5, what="the watch to report the queue")
            assert sum(o.leaderless_redeclared for o in outcomes) == 0
        finally:
            cluster.start_node(other)
        wait_for(lambda: topology.queue_status(queue) == (1, 0), timeout=60, what="the queue back")
