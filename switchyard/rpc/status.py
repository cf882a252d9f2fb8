"""The keyed RPC pools' figures for people (``switchyard pool status``, ``switchyard status``, the
console): each pool's worker groups with their state (from the pool's store), workers and backlog
(the consumers and messages of the group's request queue, from the management API), the last
activity seen, the warm spares waiting for a key, and the latency the workers report
(``x-switchyard-latency``, kept by the tracker).

A request queue with no group in the store (``switchyard pool bind``, workers started by hand) is
listed with the state ``no state``; a group whose queue is gone shows 0 workers and 0 backlog.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from switchyard.core.redis_client import RedisClient
from switchyard.rpc import protocol
from switchyard.rpc.control.management import ManagementApi
from switchyard.rpc.ports import LatencyReport
from switchyard.rpc.spares import SpareRegistry
from switchyard.rpc.store import PoolState

NO_STATE = "no state"
LATENCY_SPAN_S = 900.0  # the series shown: the last 15 minutes
LATENCY_SLOT_S = 10.0  # reports of every worker in one slot make one point
RECENT_S = 300.0  # the single figure: the worst p99 of the last 5 minutes


@dataclass(frozen=True)
class GroupFigures:
    key: str
    state: str  # active, unbound (draining: new requests become orphans), or NO_STATE
    workers: int  # consumers of the group's request queue
    backlog: int  # requests waiting in it
    last_activity_ms: int | None  # the last request or worker report seen (epoch ms)


@dataclass(frozen=True)
class LatencyPoint:
    """Every worker's reports of one slot: requests answered, their weighted p50, the worst p99 and max."""

    at: float  # epoch s
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class PoolFigures:
    pool: str
    groups: tuple[GroupFigures, ...]  # by key
    orphans: int  # requests waiting for the orphan handler ({pool}-orphan)
    dead_letters: int  # waiting for the dead-letter handler ({pool}-dl)
    poison: int  # set aside for a person ({pool}-poison)
    latency_p99_ms: float | None  # worst p99 of the last RECENT_S (None: no report)
    latency: tuple[LatencyPoint, ...]  # oldest first
    spares: int = 0  # warm spare workers waiting for a key (switchyard.rpc.spares)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def known_pools(client: RedisClient, management: ManagementApi) -> list[str]:
    """The pools the control plane knows: a state in Redis, or a declared ``{pool}-orphan`` queue."""
    declared = {q["name"][:-len("-orphan")] for q in management.list_queues(r"^[A-Za-z0-9_]{1,64}-orphan$",
                                                                             columns="name")}
    return sorted(PoolState.known_pools(client) | {n for n in declared if protocol.POOL_NAME_RE.match(n)})


def latency_series(reports: list[LatencyReport], now_s: float) -> tuple[LatencyPoint, ...]:
    """The reports of the last ``LATENCY_SPAN_S`` as points, one per ``LATENCY_SLOT_S``."""
    slots: dict[int, list[LatencyReport]] = {}
    for r in reports:
        if r.at_ms / 1000 >= now_s - LATENCY_SPAN_S:
            slots.setdefault(int(r.at_ms / 1000 // LATENCY_SLOT_S), []).append(r)
    points = []
    for slot in sorted(slots):
        group = slots[slot]
        count = sum(r.count for r in group)
        points.append(LatencyPoint(slot * LATENCY_SLOT_S, count,
                                   round(sum(r.p50_ms * r.count for r in group) / count, 3),
                                   max(r.p99_ms for r in group), max(r.max_ms for r in group)))
    return tuple(points)


def pool_figures(pool: str, client: RedisClient, management: ManagementApi,
                 now_s: float | None = None) -> PoolFigures:
    """One pool's figures: its store in Redis and one management API call for its queues."""
    now_s = time.time() if now_s is None else now_s
    state = PoolState(client, pool)
    groups = state.groups()
    queues = management.list_queues(f"^{pool}-", columns="name,messages,consumers,arguments")
    by_name = {q["name"]: q for q in queues}
    by_key: dict[str, GroupFigures] = {}
    for q in queues:
        key = protocol.key_from_request_queue(pool, q["name"], q.get("arguments"))
        if key is not None and key not in groups:
            by_key[key] = GroupFigures(key, NO_STATE, _count(q, "consumers"), _count(q, "messages"), None)
    for key, group in groups.items():
        q = by_name.get(protocol.request_queue(pool, key), {})
        by_key[key] = GroupFigures(key, group.status.value, _count(q, "consumers"), _count(q, "messages"),
                                   max(group.seen_ms, group.since_ms))

    def depth(name: str) -> int:
        return _count(by_name.get(name, {}), "messages")

    series = latency_series(state.latency(), now_s)
    recent = [pt.p99_ms for pt in series if pt.at >= now_s - RECENT_S]
    return PoolFigures(pool, tuple(by_key[k] for k in sorted(by_key)), depth(protocol.orphan_queue(pool)),
                       depth(protocol.dl_queue(pool)), depth(protocol.poison_queue(pool)),
                       max(recent) if recent else None, series, len(SpareRegistry(client, pool).waiting()))


def _count(queue: dict[str, Any], field: str) -> int:
    """A queue's figure; the management API leaves it out until the broker has sampled the queue."""
    return int(queue.get(field) or 0)
