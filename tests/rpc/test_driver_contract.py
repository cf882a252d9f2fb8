"""What every worker group driver must do (``switchyard.rpc.ports.WorkerGroupDriver``), one body run
against each driver: start, stop, scale, report. The drivers' own behaviour (real workers consuming,
ECS tags and locks, exit logging) stays in test_drivers.py and test_ecs_driver.py.

The subprocess driver runs a stand-in worker here (a process that waits for its SIGTERM): the contract
is about the driver's bookkeeping, and a real worker's start is test_drivers.py's. ECS runs in moto.
The noop driver manages nothing: it reports the groups it was told run (started by hand), and its
start and stop change nothing; each test says what that means for it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from switchyard.rpc.drivers import NoopDriver, SubprocessDriver, WorkerGroup
from switchyard.rpc.ports import WorkerGroupDriver
from tests.conftest import unique
from tests.rpc.test_ecs_driver import (  # noqa: F401 - fixtures
    cluster,
    make_driver,
    network,
    redis_client,
    register_pool,
)

MIN, MAX = 1, 3
STAND_IN = (sys.executable, "-c", "import signal; signal.pause()")  # a worker that waits for SIGTERM
DRIVERS = ("subprocess", "ecs", "noop")


@dataclass
class Case:
    """One driver under the contract. ``make(told)`` builds it; ``told`` matters to noop only (the
    groups someone started by hand); ``new_pool()`` a pool the driver can run groups of."""

    name: str
    make: Callable[[Sequence[WorkerGroup]], WorkerGroupDriver]
    new_pool: Callable[[], str]
    manages: bool = True  # starts and stops workers itself

    def running(self, groups: Sequence[WorkerGroup]) -> WorkerGroupDriver:
        """A driver with ``groups`` running: started by it, or (noop) by hand and told."""
        driver = self.make(groups)
        if self.manages:
            for group in groups:
                driver.start(group)
        return driver


@pytest.fixture(params=DRIVERS)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    made: list[WorkerGroupDriver] = []

    def keep(driver: WorkerGroupDriver) -> WorkerGroupDriver:
        made.append(driver)
        return driver

    if request.param == "subprocess":
        yield Case("subprocess", lambda _told: keep(SubprocessDriver(
            STAND_IN, min_workers=MIN, max_workers=MAX, target_backlog=10, log_dir=tmp_path, stop_timeout=5)),
            lambda: unique("contract"))
    elif request.param == "ecs":
        name = request.getfixturevalue("cluster")
        client: redis.Redis = request.getfixturevalue("redis_client")
        net = request.getfixturevalue("network")
        yield Case("ecs", lambda _told: keep(make_driver(name, client, net, min_workers=MIN,
                                                         max_workers=MAX)),
                   lambda: register_pool(unique("contract")))
    else:
        yield Case("noop", lambda told: keep(NoopDriver(told)), lambda: unique("contract"), manages=False)
    for driver in made:
        driver.close()


def test_start_is_idempotent_and_the_group_reports_running(case: Case) -> None:
    group = WorkerGroup(case.new_pool(), "infra=42 🚂")
    driver = case.make([])
    driver.start(group)
    driver.start(group)  # already running: nothing more
    if case.manages:
        assert driver.list_running(group.pool) == {group.key}
        assert driver.worker_count(group) == MIN
    else:  # nobody started it by hand
        assert driver.list_running(group.pool) == set() and driver.worker_count(group) == 0


def test_stop_is_idempotent_and_the_group_stops_reporting(case: Case) -> None:
    pool = case.new_pool()
    group, other = WorkerGroup(pool, "stopped"), WorkerGroup(pool, "kept")
    driver = case.make([])
    driver.stop(group)  # never started: nothing to do
    driver = case.running([group, other])
    driver.stop(group)
    driver.stop(group)
    assert driver.worker_count(group) == (0 if case.manages else 1)  # noop: the hand-started group runs on
    assert driver.list_running(pool) == ({"kept"} if case.manages else {"stopped", "kept"})


def test_scale_sizes_a_running_group_within_its_bounds(case: Case) -> None:
    group = WorkerGroup(case.new_pool(), "busy")
    driver = case.running([group])
    wanted = driver.scale(group, backlog=10_000)
    assert wanted == driver.worker_count(group) == (MAX if case.manages else 1)  # noop cannot count: 1
    assert driver.scale(group, backlog=0) == driver.worker_count(group) == (MIN if case.manages else 1)
    assert driver.scale(group, backlog=11) == driver.worker_count(group) == (2 if case.manages else 1)
    assert driver.list_running(group.pool) == {"busy"}


def test_each_pool_reports_its_own_groups(case: Case) -> None:
    pool, elsewhere = case.new_pool(), case.new_pool()
    ours = [WorkerGroup(pool, key) for key in ("a", "b c", "")]
    driver = case.running([*ours, WorkerGroup(elsewhere, "a")])
    assert driver.list_running(pool) == {"a", "b c", ""}
    assert driver.list_running(elsewhere) == {"a"}
    assert driver.list_running(case.new_pool()) == set()
    assert [driver.worker_count(group) for group in ours] == [MIN] * 3
    assert driver.worker_count(WorkerGroup(elsewhere, "not running")) == 0


def test_close_may_be_called_twice(case: Case) -> None:
    driver = case.running([WorkerGroup(case.new_pool(), "k")])
    driver.close()
    driver.close()
