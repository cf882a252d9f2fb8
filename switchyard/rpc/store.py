"""The rpc part's store: pool state (the keyed RPC design's pool state tracker) and its locks, in Redis.

Kept in Redis so stateless handlers can share it.

Each worker group is Active or Unbound, with the generation it entered that state under and the
last time an orphan or activity was seen for it. Handlers that bind a queue and the reconciler
that unbinds or deletes one take the same per-key lock, and the reconciler changes a group only
by compare-and-set on the state it read: an orphan or activity arriving meanwhile wins.

Stopped groups are kept as ``stopped`` (a tombstone) for a while, so that an activity report that
arrives after the stop is recognised as late and ignored: activity keeps an existing group alive,
only a request (an orphan) starts a stopped one again. The reconciler purges old tombstones.

Redis layout (prefix ``switchyard:rpc:{<pool>}:``: the braces are a Redis Cluster hash tag, so
every key one script or pipeline touches lives in the same slot):

- ``groups``       hash, worker key -> JSON ``{"s", "g", "seen", "since"}``
- ``generation``   counter of expected-state generations (64-bit)
- ``initialized``  present once the state was built; absent after a flush -> rebuild
- ``lock:{sha256(key)[:32]}``  per-key lock (token, with expiry)
- ``reconciler``   lock held by the running reconciler pass
- ``latency``      list of the workers' latency reports (JSON), newest first, the last
  ``LATENCY_REPORTS`` only (for ``switchyard status``)

and, outside any pool: ``switchyard:ecs-driver:lock:<group id>``, the ECS driver's group lock
(``WorkerGroupLock``), and one key per broker: ``switchyard:rpc:probe:{<broker id>}``, the turn of the
dead-lettering probe (whichever pool's pass takes it first probes; it expires after the interval).
On a Redis Cluster (``SWITCHYARD_REDIS_CLUSTER=1``) the client routes each command, script or
pipeline to the node owning its slot: the pool's keys share its tag, the other keys stand alone.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib import resources
from typing import cast

import redis

from switchyard.core.config import Connections
from switchyard.core.observability import logger
from switchyard.core.redis_client import RedisClient, connect_redis
from switchyard.rpc import protocol
from switchyard.rpc.errors import DriverError, LockTimeoutError
from switchyard.rpc.ports import GroupState, GroupStatus, LatencyReport, Touch, TouchMode, WorkerGroup, now_ms

# A holder that dies (a SIGKILLed control plane, a Lambda timeout) blocks its keys until the lock
# expires: 120 s here once timed out a third of a fault run's calls. Every step under a lock is a
# declare, a bind, a state write or a confirm wait; only a broker in trouble makes one take seconds,
# and then the compare-and-set on the group's state still guards the reconciler's delete. Waiters
# wait longer than this, so one redelivered batch always outlasts a dead holder's lock.
LOCK_TTL_MS = 15_000
LATENCY_REPORTS = 7200  # reports kept per pool: an hour of 2 workers reporting every second (~0.5 MB)


def _script(name: str) -> str:
    return resources.files("switchyard.rpc.lua").joinpath(name).read_text()


class RedisLocks:
    """Token locks in Redis (``SET NX PX``, released by compare-and-delete in release_lock.lua).

    The one lock of the part: the pool state's per-key locks and the ECS driver's group locks.
    """

    def __init__(self, client: RedisClient) -> None:
        self.redis = client
        self._release = client.register_script(_script("release_lock.lua"))

    def acquire(self, lock_keys: list[str], ttl_ms: int, wait: float) -> str:
        """Take every lock, in the order given; returns the token. Raises ``LockTimeoutError`` (or a
        Redis error) with nothing held."""
        token = uuid.uuid4().hex
        held: list[str] = []
        try:
            self._acquire_all(lock_keys, token, held, ttl_ms, wait)
        except BaseException:
            if held:
                self._release(keys=held, args=[token])
            raise
        return token

    def release(self, lock_keys: list[str], token: str) -> int:
        """Give back the locks this token still holds (one that expired and was retaken is left);
        returns how many it gave back."""
        return int(self._release(keys=lock_keys, args=[token])) if lock_keys else 0

    def _acquire_all(self, lock_keys: list[str], token: str, held: list[str], ttl_ms: int,
                     wait: float) -> None:
        # Fast path: everything free, one round trip.
        pipe = self.redis.pipeline(transaction=False)
        for lock_key in lock_keys:
            pipe.set(lock_key, token, nx=True, px=ttl_ms)
        results = pipe.execute()
        first_miss = next((i for i, ok in enumerate(results) if not ok), None)
        if first_miss is None:
            held.extend(lock_keys)
            return
        # Keep the prefix before the first miss; give back what was taken out of order.
        held.extend(lock_keys[:first_miss])
        out_of_order = [k for k, ok in zip(lock_keys[first_miss:], results[first_miss:], strict=True) if ok]
        if out_of_order:
            self._release(keys=out_of_order, args=[token])
        deadline = time.monotonic() + wait
        for lock_key in lock_keys[first_miss:]:
            delay = 0.002
            while not self.redis.set(lock_key, token, nx=True, px=ttl_ms):
                if time.monotonic() > deadline:
                    raise LockTimeoutError(f"lock {lock_key} still taken after {wait:.0f}s")
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
            held.append(lock_key)


ECS_LOCK_PREFIX = "switchyard:ecs-driver:lock:"
PROBE_PREFIX = "switchyard:rpc:probe:"  # + "{<broker id>}": tagged, a slot of its own per broker


class WorkerGroupLock:
    """A lock per worker group shared by every process that drives the pool (Lambda environments).

    The ECS driver's ``GroupLock``: the reconciler and the orphan handler may start one group at once.
    """

    def __init__(self, client: RedisClient, ttl_s: float = 30.0, wait_s: float = 10.0) -> None:
        self.ttl_ms = int(ttl_s * 1000)
        self.wait_s = wait_s
        self._locks = RedisLocks(client)

    @classmethod
    def from_connections(cls, connections: Connections, ttl_s: float = 30.0,
                         wait_s: float = 10.0) -> WorkerGroupLock:
        """On ``SWITCHYARD_REDIS_URL`` as the pool state is (a cluster with SWITCHYARD_REDIS_CLUSTER=1)."""
        return cls(connect_redis(connections), ttl_s, wait_s)

    @contextmanager
    def __call__(self, group: WorkerGroup) -> Iterator[None]:
        names = [ECS_LOCK_PREFIX + group.group_id]
        try:
            token = self._locks.acquire(names, self.ttl_ms, self.wait_s)
        except LockTimeoutError as exc:
            raise DriverError(f"worker group {group.group_id} is locked by another caller "
                              f"for more than {self.wait_s:g} s") from exc
        except redis.RedisError as exc:
            raise DriverError(f"cannot lock worker group {group.group_id}: {exc}") from exc
        try:
            yield
        finally:
            try:
                self._locks.release(names, token)
            except redis.RedisError:  # the lock expires on its own
                logger.warning("releasing a worker group lock failed", extra={"group_id": group.group_id})


class PoolState:
    """The expected state of one pool's worker groups. Thread-safe (redis-py pools connections)."""

    def __init__(self, client: RedisClient, pool: str) -> None:
        self.pool = protocol.validate_pool(pool)
        self.redis = client
        self.prefix = self.key_prefix(pool)
        self._groups = self.prefix + "groups"
        self._generation = self.prefix + "generation"
        self._initialized = self.prefix + "initialized"
        self._touch = client.register_script(_script("touch_groups.lua"))
        self._cas = client.register_script(_script("compare_and_set.lua"))
        self._locks = RedisLocks(client)

    @staticmethod
    def key_prefix(pool: str) -> str:
        return f"switchyard:rpc:{{{protocol.validate_pool(pool)}}}:"

    # -- state ------------------------------------------------------------------------------
    def touch(self, keys: Iterable[str], at_ms: int | None = None,
              mode: TouchMode = TouchMode.ORPHAN) -> dict[str, Touch]:
        """Groups were seen: mark them Active as ``mode`` allows; those that become Active get a new
        generation. ``ORPHAN`` and ``ACTIVITY`` touches must hold the keys' locks."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        flat = self._touch(keys=[self._groups, self._generation],
                           args=[at_ms or now_ms(), mode.value, *keys])
        result = {}
        for i in range(0, len(flat), 3):
            key = flat[i].decode() if isinstance(flat[i], bytes) else flat[i]
            result[key] = Touch(int(flat[i + 1]), int(flat[i + 2]))
        return result

    def groups(self, include_stopped: bool = False) -> dict[str, GroupState]:
        """The pool's groups (Stopped tombstones only if asked)."""
        raw = cast("dict[bytes, bytes]", self.redis.hgetall(self._groups))  # the client returns bytes
        groups = {k.decode(): GroupState.parse(k.decode(), v.decode()) for k, v in raw.items()}
        if include_stopped:
            return groups
        return {k: g for k, g in groups.items() if g.status is not GroupStatus.STOPPED}

    def get(self, key: str) -> GroupState | None:
        raw = cast("bytes | None", self.redis.hget(self._groups, key))
        return GroupState.parse(key, raw.decode()) if raw is not None else None

    def get_many(self, keys: Iterable[str]) -> dict[str, GroupState]:
        """The groups of ``keys`` that exist, read in one round trip."""
        keys = list(keys)
        if not keys:
            return {}
        raws = cast("list[bytes | None]", self.redis.hmget(self._groups, keys))
        return {key: GroupState.parse(key, raw.decode()) for key, raw in zip(keys, raws, strict=True)
                if raw is not None}

    def set_status(self, group: GroupState, status: GroupStatus, at_ms: int | None = None) -> bool:
        """Compare-and-set: move ``group`` to ``status`` only if it is still exactly as read."""
        new = group.encode(status, at_ms or now_ms())
        return bool(self._cas(keys=[self._groups], args=[group.key, group.raw, new]))

    def remove(self, group: GroupState) -> bool:
        """Compare-and-set removal (a Stopped tombstone is purged)."""
        return bool(self._cas(keys=[self._groups], args=[group.key, group.raw, ""]))

    def probe_turn(self, broker: str, interval_s: float) -> bool:
        """True for one caller per broker per ``interval_s``: the broker probe runs once, not per pool."""
        return bool(self.redis.set(f"{PROBE_PREFIX}{{{broker}}}", self.pool, nx=True,
                                   px=max(1, int(interval_s * 1000))))

    def record_latency(self, reports: Iterable[LatencyReport]) -> None:
        """Keep the workers' latency reports (one round trip; the oldest beyond the last
        ``LATENCY_REPORTS`` are dropped)."""
        encoded = [json.dumps([r.at_ms, r.key, r.count, r.p50_ms, r.p99_ms, r.max_ms]) for r in reports]
        if encoded:
            pipe = self.redis.pipeline(transaction=False)
            pipe.lpush(self.prefix + "latency", *encoded)
            pipe.ltrim(self.prefix + "latency", 0, LATENCY_REPORTS - 1)
            pipe.execute()

    def latency(self) -> list[LatencyReport]:
        """The latency reports kept, oldest first (a malformed entry is skipped)."""
        reports = []
        for raw in reversed(cast("list[bytes]", self.redis.lrange(self.prefix + "latency", 0, -1))):
            try:
                at, key, count, p50, p99, top = json.loads(raw)
                reports.append(LatencyReport(int(at), str(key), int(count), float(p50), float(p99),
                                             float(top)))
            except (ValueError, TypeError):
                continue
        return reports

    @staticmethod
    def known_pools(client: RedisClient) -> set[str]:
        """The pools that have a state in this Redis (SCAN: an admin view, not a hot path)."""
        pools = set()
        for raw in client.scan_iter(match="switchyard:rpc:{*}:groups", count=1000):
            name = (raw.decode() if isinstance(raw, bytes) else raw)[len("switchyard:rpc:{"):-len("}:groups")]
            if protocol.POOL_NAME_RE.match(name):
                pools.add(name)
        return pools

    def is_initialized(self) -> bool:
        return bool(self.redis.exists(self._initialized))

    def mark_initialized(self) -> None:
        self.redis.set(self._initialized, "1")

    def clear(self) -> int:
        """Forget the pool entirely (``switchyard pool delete``); returns the keys removed."""
        keys = list(self.redis.scan_iter(match=self.prefix + "*", count=500))
        return self.redis.delete(*keys) if keys else 0

    def generation(self) -> int:
        return int(self.redis.get(self._generation) or 0)

    # -- locks ------------------------------------------------------------------------------
    def _lock_key(self, key: str) -> str:
        return f"{self.prefix}lock:{protocol.key_digest(key)[:32]}"

    @contextmanager
    def locked(self, keys: Iterable[str], wait: float = 30.0) -> Iterator[None]:
        """Hold the per-key locks of ``keys`` (taken in sorted order, so holders never deadlock)."""
        lock_keys = sorted({self._lock_key(k) for k in keys})
        token = self._locks.acquire(lock_keys, LOCK_TTL_MS, wait)
        try:
            yield
        finally:
            self._locks.release(lock_keys, token)

    @contextmanager
    def reconciler_turn(self, ttl_ms: int = 60_000) -> Iterator[bool]:
        """Yields True if this process may run a reconciler pass now (one pass at a time per pool)."""
        key = self.prefix + "reconciler"
        token = uuid.uuid4().hex
        acquired = bool(self.redis.set(key, token, nx=True, px=ttl_ms))
        try:
            yield acquired
        finally:
            if acquired:
                self._locks.release([key], token)
