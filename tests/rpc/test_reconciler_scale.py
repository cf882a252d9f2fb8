"""What keeps the reconciler's pass within its tick at thousands of keys: queue depths read through
the management API only as often as it can afford, and the pool state read once a pass."""

from __future__ import annotations

import itertools

from switchyard.rpc.control.reconciler import DepthCadence
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.drivers import NoopDriver
from switchyard.rpc.ports import GroupStatus, WorkerGroup
from switchyard.rpc.service import ControlPlane
from switchyard.rpc.settings import ControlSettings, Delays


def test_a_listing_is_due_again_after_ten_times_what_it_took() -> None:
    now = [0.0]
    cadence = DepthCadence(share=0.1, clock=lambda: now[0])
    assert cadence.due()
    now[0] = 2.0  # the listing took 2 s
    cadence.listed(0.0)
    now[0] = 19.9
    assert not cadence.due()
    now[0] = 20.0
    assert cadence.due()
    cadence.listed(20.0)  # one that took nothing (a small pool): due again at once
    assert cadence.due()


def test_passes_between_listings_step_the_groups_without_reading_depths(make_pool) -> None:
    pool, settings = make_pool()
    keys = ["a", "b", "c"]
    plane = ControlPlane(ControlSettings(pool, Delays()), settings,
                         driver=NoopDriver([WorkerGroup(pool, k) for k in keys]))
    try:
        with PoolTopology(pool, settings) as topology:
            topology.ensure_request_queues(keys, likely_new=keys)
        plane.state.touch(keys)
        plane.state.mark_initialized()
        ticks = itertools.count()
        plane.depth_cadence = DepthCadence(share=0.1, clock=lambda: float(next(ticks)))  # each listing: 1 s
        first = plane.reconcile()
        assert not first.depths_skipped and len(first.depths) == 3, first
        second = plane.reconcile()
        assert second.depths_skipped == 1 and not second.queue_errors, second
        assert second.depths == first.depths  # reported again as last listed: the alarm sees no gap
    finally:
        plane.close()
        plane.state.clear()


class _OrphanArrivesWhileListing(NoopDriver):
    """Lists the group running, and (as an orphan handler could) makes it Active just before."""

    def __init__(self, plane: ControlPlane, key: str) -> None:
        super().__init__()
        self.plane, self.key, self.stopped = plane, key, []

    def list_running(self, pool: str) -> set[str]:
        self.plane.state.touch([self.key])
        return {self.key}

    def stop(self, group: WorkerGroup) -> None:
        self.stopped.append(group.key)


def test_a_group_revived_after_the_pass_read_the_state_is_not_stopped(make_pool) -> None:
    pool, settings = make_pool()
    plane = ControlPlane(ControlSettings(pool, Delays()), settings, NoopDriver())
    driver = _OrphanArrivesWhileListing(plane, "k")
    plane.driver = driver
    try:
        plane.state.touch(["k"], at_ms=1)
        group = plane.state.get("k")
        assert group is not None and plane.state.set_status(group, GroupStatus.STOPPED)
        plane.state.mark_initialized()
        plane.depth_cadence = None  # type: ignore[assignment]
        # The pass reads "k" Stopped; an orphan revives it, and the driver then lists it running.
        plane.reconcile()
        assert driver.stopped == []
        assert plane.state.get("k").status is GroupStatus.ACTIVE
    finally:
        plane.close()
        plane.state.clear()
