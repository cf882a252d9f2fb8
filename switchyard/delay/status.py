"""The delay scheduler's figures for people (``switchyard delay status``, ``switchyard status``, the
console): rows waiting and ready, the overdue backlog, parked messages, and how late the fire loops
published over the last minutes (the windows they record in ``fire_lateness``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from switchyard.delay.errors import StoreError
from switchyard.delay.fire import OVERDUE_AFTER_S
from switchyard.delay.model import LatenessWindow
from switchyard.delay.store import PostgresDelayStore

LATENESS_SPAN_S = 3600.0  # the lateness shown: the hour of windows the store keeps
RECENT_S = 300.0  # the single lateness figure: the worst p99 of the last 5 minutes


@dataclass(frozen=True)
class LatenessPoint:
    """Every node's windows that ended in one span, merged: fired rows, worst p99 and max."""

    at: float  # epoch s
    fired: int
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class DelayStatus:
    schema: str
    waiting: int
    ready: int  # claimed by a fire loop, not yet confirmed
    overdue: int  # waiting rows due over OVERDUE_AFTER_S ago (at most 100,000 counted)
    parked: int
    oldest_due_s: float  # how long ago the earliest waiting row was due (0: none is due yet)
    next_deadline: float | None  # epoch s of the earliest waiting row
    lateness_p99_ms: float | None  # worst p99 of the last RECENT_S (None: nothing fired)
    lateness: tuple[LatenessPoint, ...]  # oldest first
    at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def merge(windows: list[tuple[float, LatenessWindow]], span_s: float = 10.0) -> tuple[LatenessPoint, ...]:
    """Windows of several nodes as one series: those ending in the same ``span_s`` become one point."""
    points: dict[int, LatenessPoint] = {}
    for at, w in windows:
        slot = int(at // span_s)
        old = points.get(slot)
        points[slot] = LatenessPoint(slot * span_s, w.fired, w.p99_ms, w.max_ms) if old is None else \
            LatenessPoint(old.at, old.fired + w.fired, max(old.p99_ms, w.p99_ms), max(old.max_ms, w.max_ms))
    return tuple(points[slot] for slot in sorted(points))


def delay_status(store: PostgresDelayStore) -> DelayStatus:
    """The figures of ``store``'s schema, read in two queries."""
    now = datetime.now(UTC)
    try:
        overdue_before = now - timedelta(seconds=OVERDUE_AFTER_S)
        waiting, ready, overdue, parked, earliest = store.status_figures(overdue_before)
        lateness = merge(store.lateness(now - timedelta(seconds=LATENESS_SPAN_S)))
    except StoreError as exc:
        if type(exc.__cause__).__name__ == "UndefinedTable":
            raise StoreError(f"schema {store.schema} is not migrated: run switchyard delay migrate") from exc
        raise
    recent = [p.p99_ms for p in lateness if p.at >= now.timestamp() - RECENT_S]
    return DelayStatus(
        schema=store.schema, waiting=waiting, ready=ready, overdue=overdue, parked=parked,
        oldest_due_s=max(0.0, (now - earliest).total_seconds()) if earliest else 0.0,
        next_deadline=earliest.timestamp() if earliest else None,
        lateness_p99_ms=max(recent) if recent else None, lateness=lateness, at=now.timestamp())


def runner_seen(bootstrap: str, group: str, timeout_s: float = 3.0) -> bool | None:
    """Whether a delay runner reads the input topic now: its consumer group has members (the group
    is Stable or rebalancing), as Kafka tells it. None: Kafka did not say (the caller says so)."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    from switchyard.core.msk_auth import kafka_security_config

    admin = AdminClient({"bootstrap.servers": bootstrap, **kafka_security_config()})
    try:
        (future,) = admin.describe_consumer_groups([group], request_timeout=timeout_s).values()
        state = future.result(timeout=timeout_s + 1).state
    except Exception:  # an older broker, a timeout: not knowing is not an error of the call
        return None
    return state in (ConsumerGroupState.STABLE, ConsumerGroupState.PREPARING_REBALANCING,
                     ConsumerGroupState.COMPLETING_REBALANCING)
