"""The leaderless-queue watch alone: which request queues are silent long enough to be probed."""

from __future__ import annotations

from switchyard.rpc.leaderless import LeaderlessWatch


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
