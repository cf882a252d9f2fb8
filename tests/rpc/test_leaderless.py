"""The leaderless-queue watch (which request queues are silent long enough to be probed) and its probe."""

from __future__ import annotations

from switchyard.rpc import protocol
from switchyard.rpc.amqp import consume_answered
from switchyard.rpc.client import RpcClient
from switchyard.rpc.control.leaderless import LeaderlessWatch, members_away
from switchyard.rpc.control.topology import PoolTopology


def test_a_queue_silent_for_the_window_is_a_suspect_until_it_reports_or_is_cleared() -> None:
    now = [100.0]
    watch = LeaderlessWatch(silent_s=10, clock=lambda: now[0])
    silent, reporting = ("a", {"name": "q-a"}), ("b", {"name": "q-b", "messages": 0})
    assert watch.suspects([silent, reporting]) == []
    now[0] = 109.9
    assert watch.suspects([silent, reporting]) == []
    now[0] = 110.0
    assert watch.suspects([silent, reporting]) == ["a"]
    watch.cleared("a")  # it answered the probe: its silence starts over
    assert watch.suspects([silent]) == []
    now[0] = 125.0
    assert watch.suspects([silent]) == ["a"]
    assert watch.suspects([("a", {"name": "q-a", "messages": 3})]) == []  # it reports: forgotten
    now[0] = 200.0
    assert watch.suspects([silent]) == []  # silent again: a new window


def test_at_most_max_probes_suspects_a_pass_the_longest_silent_first() -> None:
    now = [0.0]
    watch = LeaderlessWatch(silent_s=10, max_probes=2, clock=lambda: now[0])
    watch.suspects([("old", {})])
    now[0] = 5.0
    queues = [("old", {}), ("b", {}), ("a", {})]
    watch.suspects(queues)
    now[0] = 15.0
    assert watch.suspects(queues) == ["old", "a"]
    watch.cleared("old")
    watch.cleared("a")
    assert watch.suspects(queues) == ["b"]


def test_a_queue_in_a_leaderless_state_is_silent_and_names_the_nodes_it_waits_for() -> None:
    """A minority queue may still report statistics (4.0.5): its state counts. Its members that are
    not online are on nodes that are down; a listing without those fields names none."""
    now = [0.0]
    watch = LeaderlessWatch(silent_s=10, clock=lambda: now[0])
    minority = {"messages": 0, "state": "minority", "members": ["n1", "n2"], "online": ["n1"]}
    watch.suspects([("a", minority), ("b", {"messages": 0, "state": "running"})])
    now[0] = 10.0
    assert watch.suspects([("a", minority), ("b", {"messages": 0, "state": "running"})]) == ["a"]
    assert members_away(minority) == ["n2"]
    assert members_away({"messages": None, "members": ["n1"], "online": ["n1"]}) == []
    assert members_away({"messages": None}) == []


def test_the_probe_hears_a_consume_ok_or_a_refusal_and_leaves_the_message(pool) -> None:
    """Only silence reads as leaderless: a missing queue's 404 is an answer, not a reason to delete."""
    name, settings = pool
    url = settings.connections.amqp_url
    queue = protocol.request_queue(name, "probed")
    with PoolTopology(name, settings) as topology:
        topology.ensure_request_queue("probed")
    with RpcClient(name, settings) as client:
        client.send("probed", "kept").result(10)
    assert consume_answered(url, queue, timeout=5)
    assert consume_answered(url, protocol.request_queue(name, "never-declared"), timeout=5)
    with PoolTopology(name, settings) as topology:
        assert topology.queue_status(queue) == (1, 0)  # the message went back
