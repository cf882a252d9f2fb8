"""Pool state in the real Redis: touch semantics, compare-and-set, per-key locks, reconciler turns."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from switchyard.rpc.errors import LockTimeoutError
from switchyard.rpc.store import GroupStatus, PoolState
from tests.conftest import unique, wait_for
from tests.rpc.conftest import flush_pool_state

T0 = 1_700_000_000_000  # a realistic epoch in ms: 13 digits must survive Lua's cjson


@pytest.fixture
def state(redis_client: redis.Redis) -> Iterator[PoolState]:
    pool = unique("st")
    yield PoolState(redis_client, pool)
    flush_pool_state(redis_client, pool)


def test_new_key_becomes_active_under_a_new_generation(state: PoolState) -> None:
    touched = state.touch(["a", "b"], at_ms=T0)
    assert touched["a"].became_active and touched["b"].became_active
    assert touched["a"].generation != touched["b"].generation
    group = state.get("a")
    assert group is not None
    assert (group.status, group.generation, group.seen_ms, group.since_ms) == (
        GroupStatus.ACTIVE, touched["a"].generation, T0, T0)
    assert state.generation() == max(t.generation for t in touched.values())


def test_active_keeps_its_generation_and_seen_only_moves_forward(state: PoolState) -> None:
    first = state.touch(["k"], at_ms=T0)["k"]
    again = state.touch(["k"], at_ms=T0 + 5_000)["k"]
    assert not again.became_active and again.generation == first.generation
    assert state.get("k").seen_ms == T0 + 5_000
    older = state.touch(["k"], at_ms=T0 + 1_000)["k"]  # a late, older report
    assert not older.became_active
    group = state.get("k")
    assert group.seen_ms == T0 + 5_000 and group.since_ms == T0
    assert state.generation() == first.generation


def test_unbound_becomes_active_under_a_new_generation(state: PoolState) -> None:
    first = state.touch(["k"], at_ms=T0)["k"]
    assert state.set_status(state.get("k"), GroupStatus.UNBOUND, T0 + 10)
    assert state.get("k").status is GroupStatus.UNBOUND
    revived = state.touch(["k"], at_ms=T0 + 20)["k"]
    assert revived.became_active and revived.generation > first.generation
    group = state.get("k")
    assert (group.status, group.seen_ms, group.since_ms) == (GroupStatus.ACTIVE, T0 + 20, T0 + 20)


def test_odd_keys_and_duplicates_in_one_touch(state: PoolState) -> None:
    keys = ["", "#", "🚂", "k" * 1024, "a\"b\\c", "#"]
    touched = state.touch(keys, at_ms=T0)
    assert set(touched) == set(keys)
    assert len({t.generation for t in touched.values()}) == 5
    assert set(state.groups()) == set(keys)


def test_compare_and_set_refuses_a_changed_state(state: PoolState) -> None:
    state.touch(["k"], at_ms=T0)
    read = state.get("k")
    state.touch(["k"], at_ms=T0 + 1)  # an orphan arrives after the read
    assert not state.set_status(read, GroupStatus.UNBOUND, T0 + 2)
    assert not state.remove(read)
    assert state.get("k").status is GroupStatus.ACTIVE
    fresh = state.get("k")
    assert state.set_status(fresh, GroupStatus.UNBOUND, T0 + 3)
    assert not state.set_status(fresh, GroupStatus.UNBOUND, T0 + 4)  # its own change counts too
    unbound = state.get("k")
    assert state.remove(unbound)
    assert state.get("k") is None
    assert not state.remove(unbound)  # already gone


def test_compare_and_set_refuses_a_group_removed_and_recreated(state: PoolState) -> None:
    state.touch(["k"], at_ms=T0)
    read = state.get("k")
    assert state.remove(read)
    state.touch(["k"], at_ms=T0)  # same clock, new generation: the raw state differs
    assert not state.set_status(read, GroupStatus.UNBOUND, T0 + 1)
    assert state.get("k").status is GroupStatus.ACTIVE


def test_locks_are_exclusive_and_released_only_by_their_holder(state: PoolState) -> None:
    with state.locked(["a", "b"]):
        with pytest.raises(LockTimeoutError), state.locked(["b"], wait=0.2):
            pass
        # A stranger's release (wrong token) leaves the lock in place.
        lock_key = state._lock_key("a")
        assert state._locks.release([lock_key], "not-the-holder") == 0
        assert state.redis.get(lock_key) is not None
    assert state.redis.get(state._lock_key("a")) is None
    with state.locked(["b"], wait=0.2):
        pass


def test_a_failed_acquire_gives_back_what_it_took(state: PoolState) -> None:
    keys = sorted(["a", "b", "c"], key=state._lock_key)
    with state.locked([keys[1]]):
        with pytest.raises(LockTimeoutError), state.locked(keys, wait=0.2):
            pass
        assert state.redis.get(state._lock_key(keys[0])) is None
        assert state.redis.get(state._lock_key(keys[2])) is None


def test_locks_are_taken_in_order_so_overlapping_holders_never_deadlock(state: PoolState) -> None:
    keys = [f"k{i}" for i in range(6)]
    errors: list[BaseException] = []
    rounds = 40

    def worker(order: list[str]) -> None:
        try:
            for _ in range(rounds):
                with state.locked(order, wait=10):
                    pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(keys[i:] + keys[:i],)) for i in range(4)]
    threads += [threading.Thread(target=worker, args=(list(reversed(keys)),))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert all(state.redis.get(state._lock_key(k)) is None for k in keys)


def test_a_second_locked_on_the_same_key_waits(state: PoolState) -> None:
    held = threading.Event()
    release = threading.Event()
    entered: list[float] = []

    def first() -> None:
        with state.locked(["k"]):
            held.set()
            release.wait(10)

    def second() -> None:
        with state.locked(["k"], wait=10):
            entered.append(time.monotonic())

    t1 = threading.Thread(target=first)
    t1.start()
    assert held.wait(5)
    t2 = threading.Thread(target=second)
    t2.start()
    time.sleep(0.3)  # window: the second holder does not get in
    assert entered == [], "the second locked() entered while the first held the lock"
    released_at = time.monotonic()
    release.set()
    wait_for(lambda: entered, timeout=5, what="the second holder to enter")
    assert entered[0] >= released_at
    t1.join(5)
    t2.join(5)


def test_one_reconciler_turn_at_a_time(state: PoolState) -> None:
    with state.reconciler_turn() as mine:
        assert mine
        with state.reconciler_turn() as other:
            assert not other
    with state.reconciler_turn() as again:
        assert again


def test_initialized_marker(state: PoolState) -> None:
    assert not state.is_initialized()
    state.mark_initialized()
    assert state.is_initialized()


def test_a_dead_holders_lock_expires_within_one_wait(state: PoolState) -> None:
    """A holder SIGKILLed inside ``locked`` never releases: its keys must come free before the next
    batch's wait ends (a 120 s lock once timed out a third of a fault run's calls)."""
    gen = state.locked(["k"])
    gen.__enter__()  # taken, and never released: the holder is gone
    started = time.monotonic()
    with state.locked(["k"], wait=30.0):
        waited = time.monotonic() - started
    assert waited < 30.0


def test_the_ecs_driver_group_lock_is_the_stores_lock(state: PoolState) -> None:
    """One lock implementation: the ECS driver's group lock is exclusive and says who holds it."""
    from switchyard.rpc.errors import DriverError
    from switchyard.rpc.ports import WorkerGroup
    from switchyard.rpc.store import ECS_LOCK_PREFIX, WorkerGroupLock

    lock = WorkerGroupLock(state.redis, ttl_s=5, wait_s=0.2)
    group = WorkerGroup(state.pool, "k")
    with lock(group):
        assert state.redis.get(ECS_LOCK_PREFIX + group.group_id) is not None
        with pytest.raises(DriverError, match="locked by another caller"), lock(group):
            pass
    assert state.redis.get(ECS_LOCK_PREFIX + group.group_id) is None


def test_the_ecs_drivers_lock_from_the_environment_works_on_any_node(
        monkeypatch: pytest.MonkeyPatch, state: PoolState) -> None:
    """The driver the control plane builds from SWITCHYARD_* takes its group locks on the same Redis
    as the pool state: on a cluster, a group whose lock's slot another node owns (no MOVED)."""
    from redis.cluster import RedisCluster

    from switchyard.core.config import Connections
    from switchyard.rpc.drivers import driver_from_env
    from switchyard.rpc.drivers.ecs import EcsDriver
    from switchyard.rpc.ports import WorkerGroup
    from switchyard.rpc.store import ECS_LOCK_PREFIX

    env = {"SWITCHYARD_RPC_DRIVER": "ecs", "SWITCHYARD_RPC_ECS_CLUSTER": "any",
           "SWITCHYARD_RPC_ECS_SUBNETS": "subnet-1",
           "SWITCHYARD_RPC_ECS_SECURITY_GROUPS": "sg-1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    driver = driver_from_env()
    assert isinstance(driver, EcsDriver)
    groups = (WorkerGroup(state.pool, f"k{i}") for i in range(100))
    group = next(groups)
    if isinstance(state.redis, RedisCluster):  # a group whose lock lives off the URL's node
        url_node = Connections.from_env().redis_url.split("//", 1)[1].split("/", 1)[0]
        group = next(g for g in groups if state.redis.get_node_from_key(ECS_LOCK_PREFIX + g.group_id).name
                     != url_node)
    with driver.lock(group):
        assert state.redis.get(ECS_LOCK_PREFIX + group.group_id) is not None
    assert state.redis.get(ECS_LOCK_PREFIX + group.group_id) is None
