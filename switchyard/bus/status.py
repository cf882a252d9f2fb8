"""The bus's figures (Routemaster's Monitor), read without side effects: ``switchyard bus status``,
``switchyard status`` and the console show them; ``housekeeping.telemetry`` also emits them as
metrics."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from switchyard.bus.jobs import JobQueue
from switchyard.bus.ports import BusStorePort
from switchyard.bus.store import QUEUES


@dataclass(frozen=True)
class SubscriberGauge:
    name: str  # the token's client name (a token is a credential: never a metric dimension)
    events: int
    batches: int
    oldest_age_ms: int
    health_points: int


@dataclass(frozen=True)
class Telemetry:
    subscribers: tuple[SubscriberGauge, ...]
    jobs: dict[str, dict[str, int]]  # queue -> state -> jobs
    used_memory: int
    autodropped: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_telemetry(store: BusStorePort) -> Telemetry:
    """Batches and events queued per subscriber (with the oldest event's age and health points),
    jobs per queue and state, Redis memory, events autodropped so far."""
    now = store.now_ms()
    names = store.tokens()
    subscribers = []
    for token in store.subscriber_tokens():
        sub = store.subscriber(token)
        if sub is None:
            continue
        events, oldest = store.queued(token)
        subscribers.append(SubscriberGauge(
            name=names.get(token, "revoked"), events=events, batches=math.ceil(events / sub.max_events),
            oldest_age_ms=0 if oldest is None else max(0, now - oldest), health_points=sub.health_points))
    jobs = {}
    for q in QUEUES:
        lengths = JobQueue(store, q).lengths()
        jobs[q] = {"instant": lengths.instant, "scheduled": lengths.scheduled, "pending": lengths.pending}
    autodropped = sum(v for k, v in store.counters().items() if k.startswith("autodropped:"))
    return Telemetry(tuple(subscribers), jobs, store.used_memory(), autodropped)
