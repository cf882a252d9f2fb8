"""The keyed RPC pools' figures for people (``switchyard pool status``, ``switchyard status``, the
console): each pool's worker groups with their state (from the pool's store), workers and backlog
(the consumers and messages of the group's request queue, from the management API), the last
activity seen, the warm spares waiting for a key, and the latency the workers report
(``x-switchyard-latency``, kept by the tracker).

A request queue with no group in the store (``switchyard pool bind``, workers started by hand) is
listed with the state ``no state``: no control plane has tracked it (its workers' activity reports
wait in ``{pool}-activity``); a group whose queue is gone shows 0 workers and 0 backlog.
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
LATENCY_SPAN_S = 3600.0  # the series shown: the last hour (as far as the store's reports reach)
LATENCY_SLOT_S = 30.0  # reports of every worker in one slot make one point
RECENT_S = 300.0  # the single figure: the worst p99 of the last 5 minutes
RATE_S = 60.0  # calls per second: the requests answered in the last minute
WORKER_CONNECTION = "switchyard-worker-"  # a worker's connection name, before its id (rpc.worker)


@dataclass(frozen=True)
class GroupFigures:
    key: str
    state: str  # active, unbound (draining: new requests become orphans), or NO_STATE
    workers: int  # consumers of the group's request queue
    backlog: int  # requests waiting in it
    last_activity_ms: int | None  # the last request or worker report seen (epoch ms)
    worker_ids: tuple[str, ...] = ()  # its consumers' worker ids (the connection's name otherwise)
    calls_per_s: float = 0.0  # requests answered per second, the last RATE_S
    latency_p99_ms: float | None = None  # worst p99 its workers reported, the last RECENT_S


@dataclass(frozen=True)
class LatencyPoint:
    """Every worker's reports of one slot: requests answered, their weighted p50, the worst p99 and max."""

    at: float  # epoch s
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    calls_per_s: float = 0.0  # count over the slot's length


@dataclass(frozen=True)
class PoolFigures:
    pool: str
    groups: tuple[GroupFigures, ...]  # by key
    orphans: int  # requests waiting for the orphan handler ({pool}-orphan)
    dead_letters: int  # waiting for the dead-letter handler ({pool}-dl)
    poison: int  # set aside for a person ({pool}-poison)
    latency_p99_ms: float | None  # worst p99 of the last RECENT_S (None: no report)
    latency: tuple[LatencyPoint, ...]  # oldest first
    control_plane: bool = False  # something consumes its orphan queue (a control plane runs)
    activity_waiting: int = 0  # worker reports no activity tracker has read ({pool}-activity)
    calls_per_s: float = 0.0  # requests answered per second, the last RATE_S, every key
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
                                   max(r.p99_ms for r in group), max(r.max_ms for r in group),
                                   round(count / LATENCY_SLOT_S, 3)))
    return tuple(points)


def key_figures(reports: list[LatencyReport], now_s: float) -> dict[str, tuple[float, float | None]]:
    """Per key: calls per second over the last ``RATE_S`` and the worst p99 of the last ``RECENT_S``."""
    counts: dict[str, int] = {}
    worst: dict[str, float] = {}
    for r in reports:
        at = r.at_ms / 1000
        if at >= now_s - RATE_S:
            counts[r.key] = counts.get(r.key, 0) + r.count
        if at >= now_s - RECENT_S:
            worst[r.key] = max(worst.get(r.key, 0.0), r.p99_ms)
    return {key: (round(counts.get(key, 0) / RATE_S, 3), worst.get(key))
            for key in counts.keys() | worst.keys()}


def worker_ids(management: ManagementApi, pool: str | None = None) -> dict[str, tuple[str, ...]]:
    """Per request queue (of ``pool``, or of every pool): the ids of the workers consuming it, their
    connections' names (two management API calls, one when nothing consumes)."""
    found: dict[str, set[str]] = {}
    prefix = f"{pool}-req-" if pool else ""

    def queue(consumer: dict[str, Any]) -> str:
        return str((consumer.get("queue") or {}).get("name") or "")

    mine = [c for c in management.list_consumers() if "-req-" in queue(c) and queue(c).startswith(prefix)]
    names = management.connection_names() if mine else {}
    for consumer in mine:
        channel = consumer.get("channel_details") or {}
        connection = str(channel.get("connection_name") or consumer.get("consumer_tag"))
        name = names.get(connection, connection)
        found.setdefault(queue(consumer), set()).add(name.removeprefix(WORKER_CONNECTION))
    return {queue: tuple(sorted(ids)) for queue, ids in found.items()}


def pool_figures(pool: str, client: RedisClient, management: ManagementApi, now_s: float | None = None,
                 workers: dict[str, tuple[str, ...]] | None = None) -> PoolFigures:
    """One pool's figures: its store in Redis and one management API call for its queues (and two
    for its workers' ids, unless ``workers`` has them: ``worker_ids()`` of several pools at once)."""
    now_s = time.time() if now_s is None else now_s
    state = PoolState(client, pool)
    groups = state.groups()
    queues = management.list_queues(f"^{pool}-", columns="name,messages,consumers,arguments")
    by_name = {q["name"]: q for q in queues}
    reports = state.latency()
    per_key = key_figures(reports, now_s)
    workers = worker_ids(management, pool) if workers is None else workers
    by_key: dict[str, GroupFigures] = {}

    def group_figures(key: str, group_state: str, q: dict[str, Any], seen: int | None) -> GroupFigures:
        calls, p99 = per_key.get(key, (0.0, None))
        return GroupFigures(key, group_state, _count(q, "consumers"), _count(q, "messages"), seen,
                            workers.get(q.get("name", ""), ()), calls, p99)

    for q in queues:
        key = protocol.key_from_request_queue(pool, q["name"], q.get("arguments"))
        if key is not None and key not in groups:
            by_key[key] = group_figures(key, NO_STATE, q, None)
    for key, group in groups.items():
        q = by_name.get(protocol.request_queue(pool, key), {})
        by_key[key] = group_figures(key, group.status.value, q, max(group.seen_ms, group.since_ms))

    def depth(name: str) -> int:
        return _count(by_name.get(name, {}), "messages")

    series = latency_series(reports, now_s)
    recent = [pt.p99_ms for pt in series if pt.at >= now_s - RECENT_S]
    orphan = by_name.get(protocol.orphan_queue(pool))
    return PoolFigures(pool, tuple(by_key[k] for k in sorted(by_key)), depth(protocol.orphan_queue(pool)),
                       depth(protocol.dl_queue(pool)), depth(protocol.poison_queue(pool)),
                       max(recent) if recent else None, series,
                       control_plane=orphan is not None and _count(orphan, "consumers") > 0,
                       activity_waiting=depth(protocol.activity_queue(pool)),
                       calls_per_s=round(sum(calls for calls, _ in per_key.values()), 3),
                       spares=len(SpareRegistry(client, pool).waiting()))


def _count(queue: dict[str, Any], field: str) -> int:
    """A queue's figure; the management API leaves it out until the broker has sampled the queue."""
    return int(queue.get(field) or 0)
