"""The reconciler reads queue depths through the management API only as often as it can afford."""

from __future__ import annotations

import itertools

from switchyard.rpc.control.reconciler import DepthCadence
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.drivers import NoopDriver
from switchyard.rpc.ports import WorkerGroup
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
        assert second.depths_skipped == 1 and second.depths == {} and not second.queue_errors, second
    finally:
        plane.close()
        plane.state.clear()
