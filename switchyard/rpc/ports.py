"""What the rpc part needs from outside: a worker group driver, the pool-state store, the pool's
queues on the broker and the broker's dead-lettering probe. The control logic sees only these
(``store.PoolState``, ``control.topology.PoolTopology`` and ``control.topology.BrokerProbe`` are the
adapters; the reconciler's unit tests run on fakes of them).

The worker group driver contract (the keyed RPC design, "Worker group" and "Worker groups control loop").

A worker group is every worker of one (pool, key): they consume the same request queue. The
worker groups control loop decides which groups should run and asks a driver to make it so;
the driver knows nothing of queues or demand, only how to start, stop, count and size workers.

How the ECS driver (``drivers/ecs.py``) maps it: ``start`` is ``run_task`` (or ``create_service``) named after
``group.group_id``, with ``group.environment(worker_id)`` as container overrides and tags
carrying the pool and the raw key; ``stop`` is ``stop_task`` on the tasks tagged with that pool
and key (or ``delete_service``); ``list_running`` lists the pool's tasks and reads the raw key
back from their tags (ECS tag values hold at most 256 characters of a restricted set, so long
or unusual keys must be stored encoded, e.g. base64url split over several tags); ``scale`` is
``update_service(desiredCount=...)``. Everything a control loop needs is in ``WorkerGroup``;
no driver method takes a handle that only one backend could produce.
"""

from __future__ import annotations

import json
import math
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from switchyard.core.errors import ConfigError, InvalidNameError
from switchyard.rpc import protocol
from switchyard.rpc.settings import MAX_WORKERS, MIN_WORKERS, TARGET_BACKLOG

GROUP_ID_DIGEST_CHARS = 24
GROUP_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


def now_ms() -> int:
    """The control plane's clock (epoch milliseconds), as the pool store stamps its groups."""
    return int(time.time() * 1000)


# The pool store's vocabulary: what a group's state is, and what a touch did to it.
class GroupStatus(StrEnum):
    ACTIVE = "active"  # queue bound, workers expected
    UNBOUND = "unbound"  # queue unbound (the keyed RPC design's first shutdown stage); workers drain it
    STOPPED = "stopped"  # workers stopped, queue deleted: a tombstone until purged


class TouchMode(StrEnum):
    """How ``PoolState.touch`` treats groups that are not Active (see touch_groups.lua)."""

    ORPHAN = "orphan"  # a request waits: any group becomes Active
    ACTIVITY = "activity"  # under the keys' locks: Unbound and unknown groups become Active
    SEEN = "seen"  # no locks: only Active groups are touched


@dataclass(frozen=True)
class GroupState:
    key: str
    status: GroupStatus
    generation: int
    seen_ms: int
    since_ms: int
    raw: str  # exactly as stored: the compare-and-set token

    @classmethod
    def parse(cls, key: str, raw: str) -> GroupState:
        data = json.loads(raw)
        return cls(key, GroupStatus(data["s"]), int(data["g"]), int(data["seen"]), int(data["since"]), raw)

    def encode(self, status: GroupStatus, since_ms: int) -> str:
        return json.dumps({"s": status.value, "g": self.generation, "seen": self.seen_ms, "since": since_ms})


@dataclass(frozen=True)
class LatencyReport:
    """One worker's summary of the requests it answered since its previous activity report
    (``x-switchyard-latency``), stamped by the tracker's clock."""

    at_ms: int
    key: str
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class Touch:
    generation: int
    code: int  # see touch_groups.lua

    @property
    def became_active(self) -> bool:
        return self.code == 1

    @property
    def needs_lock(self) -> bool:
        """Not Active and not Stopped: a ``SEEN`` touch left it for a locked ``ACTIVITY`` touch."""
        return self.code == 2

    @property
    def stopped(self) -> bool:
        return self.code == 3


@dataclass(frozen=True, slots=True)
class WorkerGroup:
    """One (pool, key): the unit a driver starts and stops. The key is any UTF-8 string."""

    pool: str
    key: str

    def __post_init__(self) -> None:
        protocol.validate_pool(self.pool)
        protocol.key_digest(self.key)  # rejects non-strings and strings that are not valid UTF-8

    @property
    def group_id(self) -> str:
        """``{pool}-{24 hex of sha256(key)}``: deterministic and safe as an ECS service or task name.

        Pools are ``[A-Za-z0-9_]{1,64}``, so the id is at most 89 characters of ``[A-Za-z0-9_-]``;
        96 bits of digest make a collision between two keys of one pool negligible.
        """
        group_id = f"{self.pool}-{protocol.key_digest(self.key)[:GROUP_ID_DIGEST_CHARS]}"
        if not GROUP_ID_RE.match(group_id):  # cannot happen with a valid pool; guards future edits
            raise InvalidNameError(f"unsafe worker group id {group_id!r}")
        return group_id

    @property
    def requests_queue(self) -> str:
        return protocol.request_queue(self.pool, self.key)

    def environment(self, worker_id: str) -> dict[str, str]:
        """The worker protocol's variables (the keyed RPC design, "Worker protocol") for one worker."""
        return {
            "WORKER_ID": worker_id,
            "WORKER_KEY": self.key,
            "WORKER_POOL": self.pool,
            "WORKER_REQUESTS_QUEUE": self.requests_queue,
            "WORKER_ACTIVITY_EXCHANGE": protocol.activity_exchange(self.pool),
        }


def check_sizes(min_workers: int, max_workers: int, target_backlog: int) -> None:
    """Reject group sizes no driver can honour (shared by every driver that scales)."""
    if min_workers < 1:
        raise ConfigError(f"{MIN_WORKERS.name} must be at least 1 (a started group runs a worker)")
    if max_workers < min_workers:
        raise ConfigError(f"{MAX_WORKERS.name} must be at least {MIN_WORKERS.name}")
    if target_backlog < 1:
        raise ConfigError(f"{TARGET_BACKLOG.name} must be at least 1")


def desired_workers(backlog: int, *, min_workers: int, max_workers: int, target_backlog: int) -> int:
    """KEDA's queue-length rule: ``ceil(backlog / target_backlog)`` clamped to ``[min, max]``."""
    if target_backlog < 1:
        raise ConfigError("target backlog must be at least 1 message per worker")
    wanted = math.ceil(max(0, backlog) / target_backlog)
    return max(min_workers, min(max_workers, wanted))


class WorkerGroupDriver(ABC):
    """Starts and stops worker groups. Methods never retry internally: the control loop retries.

    ``start`` and ``stop`` are idempotent; failures raise ``DriverError``.
    """

    @abstractmethod
    def start(self, group: WorkerGroup) -> None:
        """Make the group run (at least its minimum number of workers); no-op if it already runs."""

    @abstractmethod
    def stop(self, group: WorkerGroup) -> None:
        """Stop every worker of the group (each finishes its request in hand); no-op if none runs."""

    @abstractmethod
    def list_running(self, pool: str) -> set[str]:
        """The keys of the pool's groups that have at least one live worker."""

    def worker_count(self, group: WorkerGroup) -> int:
        """Live workers of the group; drivers that cannot count say 1 for a running group."""
        return 1 if group.key in self.list_running(group.pool) else 0

    def scale(self, group: WorkerGroup, backlog: int) -> int:
        """Size a running group for ``backlog`` waiting requests; returns the worker count now wanted.

        Call it only for groups the control loop wants running. The default does not scale.
        """
        return self.worker_count(group)

    def keep_spares(self, pool: str) -> int:
        """Start warm spares up to the driver's minimum (the reconciler's every pass); how many it
        started. Drivers that keep none, or keep them otherwise (the subprocess driver's thread): 0."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for drivers that hold nothing
        """Release what the driver holds (the subprocess driver stops its workers)."""


GroupLock = Callable[[WorkerGroup], AbstractContextManager[Any]]
"""Holds one worker group's lock across processes (``store.WorkerGroupLock``); raises ``DriverError``."""


class PoolStore(Protocol):
    """The expected state of one pool's worker groups and its per-key locks (``store.PoolState``).

    The control plane's handlers and the reconciler see the store only through this.
    """

    pool: str

    def touch(self, keys: Iterable[str], at_ms: int | None = None,
              mode: TouchMode = ...) -> dict[str, Touch]: ...

    def groups(self, include_stopped: bool = False) -> dict[str, GroupState]: ...

    def get(self, key: str) -> GroupState | None: ...

    def get_many(self, keys: Iterable[str]) -> dict[str, GroupState]: ...

    def set_status(self, group: GroupState, status: GroupStatus, at_ms: int | None = None) -> bool: ...

    def remove(self, group: GroupState) -> bool: ...

    def probe_turn(self, broker: str, interval_s: float) -> bool: ...

    def record_latency(self, reports: Iterable[LatencyReport]) -> None: ...

    def is_initialized(self) -> bool: ...

    def mark_initialized(self) -> None: ...

    def generation(self) -> int: ...

    def locked(self, keys: Iterable[str], wait: float = 30.0) -> AbstractContextManager[None]: ...

    def reconciler_turn(self, ttl_ms: int = 60_000) -> AbstractContextManager[bool]: ...


class RequestQueues(Protocol):
    """One pool's request queues on the broker, as the control loops see them (``PoolTopology``).

    Operations are idempotent and raise Switchyard's errors only (the adapter translates its
    client's): a broker's refusal ``TopologyError``, a lost connection ``BrokerUnavailableError``, a
    management API failure ``ManagementApiError``.
    """

    pool: str

    @property
    def queue_type(self) -> protocol.QueueType: ...

    def list_request_queues(self, columns: str) -> list[dict[str, Any]]:
        """The pool's ``{pool}-req-*`` queues with the management API's ``columns`` (sampled stats)."""
        ...

    def queue_status(self, queue: str) -> tuple[int, int] | None:
        """``(ready messages, consumers)``, exact, or None when the queue does not exist."""
        ...

    def ensure_request_queue(self, key: str, bind: bool = True) -> str: ...

    def ensure_request_queues(self, keys: Iterable[str], likely_new: Iterable[str] = (),
                              parallel: int = 8) -> None: ...

    def unbind_request_queue(self, key: str) -> None: ...

    def delete_request_queue(self, key: str) -> None: ...

    def answers_consume(self, queue: str, timeout_s: float) -> bool:
        """Whether the broker answers a consume on ``queue`` in time (False: silence, no leader)."""
        ...


class DeadLetteringProbe(Protocol):
    """Whether the broker can still start an at-least-once dead-lettering queue (``BrokerProbe``)."""

    @property
    def broker(self) -> str:
        """Names the broker and vhost probed: the probe's turn is shared by every pool on it."""
        ...

    def stranded(self) -> bool:
        """Probe now: True when the broker's dead-letter supervisor is gone; a failure raises."""
        ...
