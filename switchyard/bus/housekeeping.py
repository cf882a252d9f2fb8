"""The bus's periodic jobs: autodrop under memory pressure (and of old unclaimed topics nobody
subscribes to), the scrubber, and telemetry.

They run as ``aux`` jobs on the job queue (so one worker at a time runs each, whatever the number
of workers), and the scheduled Lambda function ``bus_housekeeping`` runs them too, so telemetry
and autodrop go on while no worker is up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from switchyard.bus.jobs import JobQueue, scrub
from switchyard.bus.store import QUEUES, BusStore, as_text
from switchyard.core.observability import emit_gauge, logger


@dataclass
class AutodropOutcome:
    used_memory: int = 0
    batches_dropped: int = 0
    events_dropped: int = 0
    dropped_by_subscriber: dict[str, int] = field(default_factory=dict)
    topics_dropped: int = 0


def used_memory(store: BusStore) -> int:
    return int(store.redis.info("memory")["used_memory"])


def autodrop(store: BusStore) -> AutodropOutcome:
    """Remove unclaimed topics without subscribers older than ``unclaimed_topic_ttl_ms`` (clients
    create them by subscribing); above ``max_mem - min_free`` bytes used, delete the oldest batches
    until below ``max_mem - 2 * min_free`` (Routemaster's marks); each dropped event is counted."""
    s = store.settings
    outcome = AutodropOutcome(used_memory=used_memory(store), topics_dropped=store.drop_unclaimed_topics())
    if outcome.topics_dropped:
        logger.info("bus autodrop: unclaimed topics without subscribers removed",
                    extra={"topics": outcome.topics_dropped})
    if outcome.used_memory <= s.max_mem - s.min_free:
        emit_gauge("BusEventsAutodropped", 0, "Bus", "all")
        return outcome
    low_mark = s.max_mem - 2 * s.min_free
    script = store.script("autodrop")
    used = outcome.used_memory
    while used > low_mark:
        dropped = script(keys=[store.subscribers_key, store.counters_key], args=[store.prefix])
        if not dropped:
            break
        token, count = as_text(dropped[0]), int(dropped[1])
        outcome.batches_dropped += 1
        outcome.events_dropped += count
        outcome.dropped_by_subscriber[token] = outcome.dropped_by_subscriber.get(token, 0) + count
        used = used_memory(store)
    emit_gauge("BusEventsAutodropped", outcome.events_dropped, "Bus", "all")
    logger.warning("bus autodrop", extra={"batches": outcome.batches_dropped,
                                          "events": outcome.events_dropped,
                                          "used_memory": outcome.used_memory, "now": used})
    return outcome


@dataclass(frozen=True)
class SubscriberGauge:
    name: str  # the token's client name (a token is a credential: never a metric dimension)
    events: int
    batches: int
    oldest_age_ms: int
    health_points: int


@dataclass
class Telemetry:
    subscribers: list[SubscriberGauge] = field(default_factory=list)
    jobs: dict[str, dict[str, int]] = field(default_factory=dict)
    used_memory: int = 0
    autodropped: int = 0


def telemetry(store: BusStore) -> Telemetry:
    """Routemaster's Monitor: batches and events queued per subscriber (with the oldest event's age
    and health points), jobs per queue and state, Redis memory; emitted as Powertools metrics."""
    now = store.now_ms()
    names = store.tokens()
    out = Telemetry(used_memory=used_memory(store))
    for token in store.subscriber_tokens():
        sub = store.subscriber(token)
        if sub is None:
            continue
        events, oldest = store.queued(token)
        out.subscribers.append(SubscriberGauge(
            name=names.get(token, "revoked"), events=events, batches=math.ceil(events / sub.max_events),
            oldest_age_ms=0 if oldest is None else max(0, now - oldest), health_points=sub.health_points))
    for q in QUEUES:
        lengths = JobQueue(store, q).lengths()
        out.jobs[q] = {"instant": lengths.instant, "scheduled": lengths.scheduled, "pending": lengths.pending}
    out.autodropped = sum(v for k, v in store.counters().items() if k.startswith("autodropped:"))
    _emit(out)
    return out


def _emit(t: Telemetry) -> None:
    for g in t.subscribers:
        emit_gauge("BusEventsQueued", g.events, "Subscriber", g.name)
        emit_gauge("BusBatchesQueued", g.batches, "Subscriber", g.name)
        emit_gauge("BusOldestEventAgeMs", g.oldest_age_ms, "Subscriber", g.name)
        emit_gauge("BusSubscriberHealth", g.health_points, "Subscriber", g.name)
    for q, states in t.jobs.items():
        for state, n in states.items():
            emit_gauge("BusJobs", n, "QueueState", f"{q}:{state}")
    # Bus-wide figures without dimensions: what the alarms watch.
    emit_gauge("BusRedisUsedMemory", t.used_memory, "Bus", "all")
    lowest_health = min((g.health_points for g in t.subscribers), default=100)
    emit_gauge("BusMinSubscriberHealth", lowest_health, "Bus", "all")
    oldest_age = max((g.oldest_age_ms for g in t.subscribers), default=0)
    emit_gauge("BusMaxOldestEventAgeMs", oldest_age, "Bus", "all")
    # Cumulative (Redis counters): whoever dropped, the alarm sees the increase (metric math DIFF).
    emit_gauge("BusEventsAutodroppedTotal", t.autodropped, "Bus", "all")


def run_aux_job(store: BusStore, job: str) -> object:
    """Run one housekeeping job by name."""
    if job == "autodrop":
        return autodrop(store)
    if job == "monitor":
        return telemetry(store)
    if job == "scrub":
        return scrub(store, store.settings.scrub_after_ms)
    raise ValueError(f"unknown aux job {job!r}")


def aux_intervals(store: BusStore) -> dict[str, int]:
    s = store.settings
    return {"autodrop": s.autodrop_interval_ms, "monitor": s.monitor_interval_ms,
            "scrub": s.scrub_interval_ms}


@dataclass
class HousekeepingOutcome:
    promoted: int = 0
    scrubbed_jobs: int = 0
    workers_forgotten: int = 0
    events_autodropped: int = 0
    topics_dropped: int = 0
    subscribers: int = 0


def housekeep(store: BusStore) -> HousekeepingOutcome:
    """One pass of everything periodic (the scheduled function's work): promote due jobs, scrub dead
    workers, autodrop, telemetry. Safe beside running workers: each step is one atomic script."""
    out = HousekeepingOutcome()
    out.promoted = sum(JobQueue(store, q).promote_due() for q in QUEUES)
    out.scrubbed_jobs, out.workers_forgotten = scrub(store, store.settings.scrub_after_ms)
    dropped = autodrop(store)
    out.events_autodropped, out.topics_dropped = dropped.events_dropped, dropped.topics_dropped
    out.subscribers = len(telemetry(store).subscribers)
    return out
