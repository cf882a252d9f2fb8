"""RPC on the three-node RabbitMQ cluster: the node the client is connected to SIGKILLed under
traffic, and started again.

The client is given nodes 2 and 3 (it lands on one at random, ``amqp.connect``) and the node it is
on is killed at a fixed point of the run, so its connection dies with calls in flight: those the
broker had not confirmed, those in the workers' queues and those being handled, whose answers could
only have come to the dead connection's reply queue. The client must re-send them all on the other
node (``rpc.client.resend``): the traffic does not retry (``retry=False``), so a caller that saw an
error counts as lost even if a worker handled its request. Duplicates (handled twice, counted by
the worker) are allowed. The control plane and its workers stay on node 1, which also answers the
management API; the pool's queue leaders are there. The cluster (tests/rpc/cluster.py) is left
with three running nodes, its dead-lettering checked as for the single 4.0 broker.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from tests.faults.account import Account
from tests.faults.rpc import RpcRig, RpcSize, RpcTraffic
from tests.rpc import cluster

SIZES = {"full": RpcSize(requests=3000, keys=12, rate=100), "short": RpcSize(240, 6, 60)}
KILL_AT = 0.4  # of the requests submitted


def run_cluster_kill(scenario: str, size: RpcSize, workdir: Path) -> Account:
    cluster.ensure_running()
    try:
        return _run(scenario, size, workdir)
    finally:
        cluster.ensure_running()
        if cluster.heal_dead_lettering() != "running":
            raise AssertionError("the scenario stranded a cluster node's dead-letter supervisor "
                                 "(restarted since)")


def _run(scenario: str, size: RpcSize, workdir: Path) -> Account:
    with RpcRig(workdir, cluster.connections(cluster.node_url(1))) as rig:
        settings = replace(rig.settings, connections=cluster.connections(cluster.urls(2, 3)))
        start = time.monotonic()
        traffic = RpcTraffic(rig.pool, settings, size, retry=False).start()
        traffic.wait_progress(KILL_AT)
        client = traffic.client
        assert client is not None, "the traffic's client never connected"
        node, in_flight = cluster.client_node(client), client.in_flight
        killed = time.monotonic()
        cluster.kill(node)
        cluster.start_node(node)
        traffic.fault_over(killed)
        traffic.join()
        handled = rig.handled()
        # A caller that saw an error is lost, whatever a worker did with its request.
        seen = {rid: 0 if rid in traffic.failures else max(traffic.answers[rid], handled.get(rid, 0))
                for rid in traffic.ids}
        failed = sorted({f.split(":")[0] for f in traffic.failures.values()})
        note = (f"node {node} killed with {in_flight} calls in flight; {client.stats.resent} re-sent by "
                f"the client, {client.stats.interrupted} interrupted; callers failed: "
                f"{len(traffic.failures)}{' (' + ', '.join(failed) + ')' if failed else ''}")
        return Account.settle(scenario, traffic.ids, seen, time.monotonic() - start, 1, note,
                              traffic.recovery())
