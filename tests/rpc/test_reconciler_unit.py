"""The reconciler on fake adapters (tests/rpc/fakes.py): no broker, the pool store on Redis.

Each test drives passes at chosen instants (``run_pass(at_ms)``), so the delays need no waiting.
The same control loops run on RabbitMQ in test_control_plane.py, test_leaderless.py and the
cluster and fault suites.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from switchyard.core.redis_client import RedisClient
from switchyard.rpc import protocol
from switchyard.rpc.control.leaderless import LeaderlessWatch
from switchyard.rpc.control.reconciler import DepthCadence, Reconciler
from switchyard.rpc.ports import GroupStatus, WorkerGroup, now_ms
from switchyard.rpc.settings import Delays
from switchyard.rpc.store import PoolState
from tests.conftest import unique
from tests.rpc.conftest import flush_pool_state
from tests.rpc.fakes import FakeDriver, FakeProbe, FakeQueues

T0 = 1_700_000_000_000  # the instant the groups were last seen (epoch ms)
DELAYS = Delays(unbind_s=10, stop_s=20, tombstone_s=60)


class Rig:
    def __init__(self, state: PoolState, queue_type: protocol.QueueType = protocol.QueueType.QUORUM) -> None:
        self.state = state
        self.queues = FakeQueues(state.pool, queue_type)
        self.driver = FakeDriver()

    def reconciler(self, **kwargs: object) -> Reconciler:
        return Reconciler(self.state, self.queues, self.driver, DELAYS, **kwargs)  # type: ignore[arg-type]

    def active(self, *keys: str, at_ms: int = T0, **queue: object) -> None:
        """Groups seen at ``at_ms``, their queues bound, their workers running."""
        self.state.mark_initialized()
        self.state.touch(keys, at_ms)
        for key in keys:
            self.queues.add(key, **queue)  # type: ignore[arg-type]
            self.driver.running.add(key)

    def status(self, key: str) -> GroupStatus | None:
        group = self.state.get(key)
        return None if group is None else group.status


@pytest.fixture
def rig(redis_client: RedisClient) -> Iterator[Rig]:
    pool = unique("recunit")
    yield Rig(PoolState(redis_client, pool))
    flush_pool_state(redis_client, pool)


def test_an_idle_group_is_unbound_then_stopped_its_queue_deleted_and_its_tombstone_purged(rig: Rig) -> None:
    t0 = now_ms() - 31_000  # the tombstone is stamped with the real clock: the stop pass is now
    rig.active("k", at_ms=t0)
    reconciler = rig.reconciler()
    assert reconciler.run_pass(t0 + 9_000).unbound == 0
    assert rig.queues.get("k").bound  # type: ignore[union-attr]
    assert reconciler.run_pass(t0 + 10_000).unbound == 1
    assert rig.status("k") is GroupStatus.UNBOUND and not rig.queues.get("k").bound  # type: ignore[union-attr]
    assert "k" in rig.driver.running  # Unbound inside STOP_DELAY: its workers drain the queue
    outcome = reconciler.run_pass(t0 + 31_000)
    assert (outcome.stopped, outcome.queues_deleted) == (1, 1)
    assert rig.status("k") is GroupStatus.STOPPED and rig.queues.get("k") is None
    assert "k" not in rig.driver.running
    assert reconciler.run_pass(t0 + 31_000 + 55_000).tombstones_purged == 0
    assert reconciler.run_pass(t0 + 31_000 + 65_000).tombstones_purged == 1
    assert rig.state.get("k") is None


def test_an_unbound_queue_still_holding_requests_is_bound_again_not_deleted(rig: Rig) -> None:
    rig.active("k")
    reconciler = rig.reconciler()
    reconciler.run_pass(T0 + 10_000)
    rig.queues.get("k").messages = 3  # type: ignore[union-attr]
    outcome = reconciler.run_pass(T0 + 31_000)
    assert (outcome.kept_nonempty, outcome.stopped, outcome.queues_deleted) == (1, 0, 0)
    assert rig.status("k") is GroupStatus.ACTIVE and rig.queues.get("k").bound  # type: ignore[union-attr]
    assert "k" in rig.driver.running


def test_a_queue_whose_stopped_workers_still_consume_waits_for_the_next_pass(rig: Rig) -> None:
    rig.active("k", consumers=1)
    reconciler = rig.reconciler()
    reconciler.run_pass(T0 + 10_000)
    outcome = reconciler.run_pass(T0 + 31_000)
    assert (outcome.stopped, outcome.waiting_for_consumers, outcome.queues_deleted) == (1, 1, 0)
    assert rig.status("k") is GroupStatus.UNBOUND and rig.queues.get("k") is not None
    assert "k" not in rig.driver.running  # and not started again: it is being stopped
    rig.queues.get("k").consumers = 0  # type: ignore[union-attr]
    assert reconciler.run_pass(T0 + 32_000).queues_deleted == 1
    assert rig.status("k") is GroupStatus.STOPPED


def test_a_lost_state_is_rebuilt_from_the_queues_and_the_running_groups(rig: Rig) -> None:
    rig.queues.add("queued")
    rig.queues.foreign.append(protocol.request_queue_prefix(rig.state.pool) + "not~ours")
    rig.driver.running.add("running")
    outcome = rig.reconciler().run_pass(T0)
    assert outcome.rebuilt_groups == 2 and outcome.foreign_queues >= 1
    assert rig.state.is_initialized()
    assert rig.status("queued") is rig.status("running") is GroupStatus.ACTIVE
    assert rig.queues.get("running") is not None  # declared for the group the driver runs
    assert rig.driver.running == {"queued", "running"}


def test_groups_converge_on_the_state_and_running_ones_scale_on_their_depth(rig: Rig) -> None:
    rig.active("up", messages=7)
    rig.driver.running.discard("up")
    rig.driver.running.add("stray")  # the state expects no such group
    outcome = rig.reconciler().run_pass(T0 + 1_000)
    assert (outcome.groups_started, outcome.groups_stopped) == (1, 1)
    assert rig.driver.running == {"up"} and rig.driver.scaled == {"up": 7}
    assert outcome.depths == {WorkerGroup(rig.state.pool, "up").group_id: 7}


def test_a_failing_step_is_counted_and_the_pass_goes_on(rig: Rig) -> None:
    rig.active("a", "b")
    rig.driver.fail.add("c")
    rig.state.touch(["c"], T0)
    rig.queues.fail.add("unbind")
    outcome = rig.reconciler().run_pass(T0 + 10_000)
    assert outcome.queue_errors == 3  # every idle group's unbind refused; none stopped the pass
    assert rig.status("a") is GroupStatus.UNBOUND  # as it was: the stop, past STOP_DELAY, deletes the queue
    assert outcome.driver_errors == 1 and outcome.groups_started == 0
    assert outcome.depths  # the listing still ran


def test_depths_are_listed_on_the_cadence_and_repeated_between_listings(rig: Rig) -> None:
    rig.active("k", messages=2)
    now = [0.0]
    cadence = DepthCadence(share=0.1, clock=lambda: now[0])
    reconciler = rig.reconciler(cadence=cadence)
    first = reconciler.run_pass(T0)
    now[0] = 0.0  # the listing took no time on this clock: due again at once
    rig.queues.get("k").messages = 5  # type: ignore[union-attr]
    assert reconciler.run_pass(T0).depths == {WorkerGroup(rig.state.pool, "k").group_id: 5}
    cadence._next = 100.0  # a slow listing: not due for a while
    skipped = reconciler.run_pass(T0)
    assert skipped.depths_skipped == 1 and skipped.depths == {WorkerGroup(rig.state.pool, "k").group_id: 5}
    assert first.depths_skipped == 0
    assert [c for c in rig.queues.calls if c[0] == "list"] == [("list", rig.state.pool)] * 2


def test_a_silent_queue_not_answering_is_declared_again_one_whose_nodes_are_down_kept(rig: Rig) -> None:
    rig.active("lost", "away", messages=None)
    rig.queues.get("lost").answers = False  # type: ignore[union-attr]
    rig.queues.get("away").listed.update(members=["n1", "n2", "n3"], online=["n1"])  # type: ignore[union-attr]
    watch = LeaderlessWatch(silent_s=0.0)
    outcome = rig.reconciler(leaderless=watch).run_pass(T0 + 1_000)
    assert (outcome.leaderless_redeclared, outcome.leaderless_waiting) == (1, 1)
    lost = protocol.request_queue(rig.state.pool, "lost")
    assert ("delete", "lost") in rig.queues.calls and rig.queues.get("lost").bound  # type: ignore[union-attr]
    assert ("consume", lost) in rig.queues.calls
    assert ("delete", "away") not in rig.queues.calls


def test_a_classic_pool_is_neither_probed_nor_watched_for_leaderless_queues(
        redis_client: RedisClient) -> None:
    rig = Rig(PoolState(redis_client, unique("recunit")), protocol.QueueType.CLASSIC)
    try:
        rig.active("k", messages=None)
        probe = FakeProbe(broker=unique("broker"), stranded=True)
        outcome = rig.reconciler(probe=probe, probe_interval_s=60,
                                 leaderless=LeaderlessWatch(silent_s=0.0)).run_pass(T0)
        assert probe.probes == 0 and outcome.dead_lettering_probes == 0
        assert not [c for c in rig.queues.calls if c[0] == "consume"]
    finally:
        flush_pool_state(redis_client, rig.state.pool)


def test_the_probe_runs_once_per_interval_across_pools_and_counts_a_stranded_broker(
        rig: Rig, redis_client: RedisClient) -> None:
    broker = unique("broker")
    probe = FakeProbe(broker=broker, stranded=True)
    outcome = rig.reconciler(probe=probe, probe_interval_s=60).run_pass(T0)
    assert (outcome.dead_lettering_probes, outcome.dead_lettering_stranded, probe.probes) == (1, 1, 1)
    other = Rig(PoolState(redis_client, unique("recunit")))
    try:  # another pool on the same broker, inside the interval: not probed again
        assert other.reconciler(probe=probe, probe_interval_s=60).run_pass(T0).dead_lettering_probes == 0
    finally:
        flush_pool_state(redis_client, other.state.pool)
    failing = FakeProbe(broker=unique("broker"), error=RuntimeError("probe lost its connection"))
    outcome = rig.reconciler(probe=failing, probe_interval_s=60).run_pass(T0)
    assert (outcome.queue_errors, outcome.dead_lettering_probes, failing.probes) == (1, 0, 1)
