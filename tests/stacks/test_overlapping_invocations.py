"""Overlapping scheduled invocations are safe, as the deployment relies on (a schedule fires every
minute whether or not the last invocation has ended; reserved concurrency lets two overlap).

The reconciler of one pool, invoked four times at once from four "Lambda environments" (separate
control planes sharing only Redis, RabbitMQ and ECS), with the ECS driver on moto: the Active group
is started exactly once, and later overlapping passes leave it as it is. (Overlapping delay fire
invocations are tested in tests/delay/test_fire.py: two loops fire each message once.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from switchyard.rpc.control.reconciler import ReconcileOutcome
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.drivers import WorkerGroup
from switchyard.rpc.service import ControlPlane
from switchyard.rpc.settings import ControlSettings, Delays
from switchyard.rpc.store import PoolState
from tests.rpc.conftest import PoolFactory, flush_pool_state, make_pool  # noqa: F401 - fixture
from tests.rpc.test_ecs_driver import MOTO, cluster, ecs_client, make_driver, network, running_tasks  # noqa: F401 - fixtures
from tests.rpc.test_ecs_driver import redis_client as ecs_redis  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


@pytest.fixture
def ecs_pool(make_pool: PoolFactory) -> Iterator[tuple[str, object]]:  # noqa: F811
    pool, settings = make_pool()
    ecs_client(MOTO).register_task_definition(
        family=f"switchyard-worker-{pool}", requiresCompatibilities=["FARGATE"], networkMode="awsvpc",
        cpu="256", memory="512",
        containerDefinitions=[{"name": "worker", "image": "switchyard:test", "memory": 512}])
    yield pool, settings
    flush_pool_state(redis.Redis.from_url(settings.connections.redis_url), pool)


def overlapping_passes(planes: list[ControlPlane]) -> list[ReconcileOutcome]:
    barrier = threading.Barrier(len(planes))
    outcomes: list[ReconcileOutcome] = []
    errors: list[BaseException] = []

    def invoke(plane: ControlPlane) -> None:
        barrier.wait()
        try:
            outcomes.append(plane.reconcile())
        except BaseException as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=invoke, args=(plane,)) for plane in planes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    return outcomes


def test_overlapping_reconcile_invocations_start_an_active_group_once(
        ecs_pool: tuple[str, object], cluster: str, ecs_redis: redis.Redis,  # noqa: F811
        network: tuple[str, str]) -> None:  # noqa: F811
    pool, settings = ecs_pool
    state = PoolState(ecs_redis, pool)
    with PoolTopology(pool, settings) as topology, state.locked(["k"]):  # as the orphan handler would
        state.touch(["k"])
        topology.ensure_request_queues(["k"])
    state.mark_initialized()
    planes = [ControlPlane(ControlSettings(pool, Delays()), settings,
                           driver=make_driver(cluster, ecs_redis, network, min_workers=1, max_workers=3),
                           redis_client=ecs_redis) for _ in range(4)]
    try:
        for _ in range(3):
            outcomes = overlapping_passes(planes)
            assert sum(o.driver_errors for o in outcomes) == 0
            assert len(running_tasks(cluster, WorkerGroup(pool, "k"))) == 1
        started = sum(o.groups_started for o in outcomes)
        assert started == 0  # the last round found the group running
    finally:
        for plane in planes:
            plane.close()
