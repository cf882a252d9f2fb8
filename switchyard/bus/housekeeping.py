"""The bus's periodic jobs: autodrop under memory pressure (and of old unclaimed topics nobody
subscribes to), the scrubber, and telemetry.

They run as ``aux`` jobs on the job queue (so one worker at a time runs each, whatever the number
of workers), and the scheduled Lambda function ``bus_housekeeping`` runs them too, so telemetry
and autodrop go on while no worker is up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from switchyard.bus import metrics
from switchyard.bus.errors import UnknownJobError
from switchyard.bus.jobs import JobQueue, scrub
from switchyard.bus.ports import BusStorePort
from switchyard.bus.status import Telemetry, read_telemetry
from switchyard.bus.store import QUEUES
from switchyard.core.observability import emit_gauge, logger


@dataclass
class AutodropOutcome:
    used_memory: int = 0
    batches_dropped: int = 0
    events_dropped: int = 0
    dropped_by_subscriber: dict[str, int] = field(default_factory=dict)
    topics_dropped: int = 0


def autodrop(store: BusStorePort) -> AutodropOutcome:
    """Remove unclaimed topics without subscribers older than ``unclaimed_topic_ttl_ms`` (clients
    create them by subscribing); above ``max_mem - min_free`` bytes used, delete the oldest batches
    until below ``max_mem - 2 * min_free`` (Routemaster's marks); each dropped event is counted."""
    s = store.settings
    outcome = AutodropOutcome(used_memory=store.used_memory(), topics_dropped=store.drop_unclaimed_topics())
    if outcome.topics_dropped:
        logger.info("bus autodrop: unclaimed topics without subscribers removed",
                    extra={"topics": outcome.topics_dropped})
    if outcome.used_memory <= s.max_mem - s.min_free:
        emit_gauge(metrics.BUS_EVENTS_AUTODROPPED, 0, "Bus", "all")
        return outcome
    low_mark = s.max_mem - 2 * s.min_free
    used = outcome.used_memory
    while used > low_mark:
        dropped = store.autodrop_batch()
        if dropped is None:
            break
        token, count = dropped
        outcome.batches_dropped += 1
        outcome.events_dropped += count
        outcome.dropped_by_subscriber[token] = outcome.dropped_by_subscriber.get(token, 0) + count
        used = store.used_memory()
    emit_gauge(metrics.BUS_EVENTS_AUTODROPPED, outcome.events_dropped, "Bus", "all")
    logger.warning("bus autodrop", extra={"batches": outcome.batches_dropped,
                                          "events": outcome.events_dropped,
                                          "used_memory": outcome.used_memory, "now": used})
    return outcome


def telemetry(store: BusStorePort) -> Telemetry:
    """Routemaster's Monitor: the bus's figures (``status.read_telemetry``), emitted as Powertools metrics."""
    out = read_telemetry(store)
    _emit(out)
    return out


def _emit(t: Telemetry) -> None:
    for g in t.subscribers:
        emit_gauge(metrics.BUS_EVENTS_QUEUED, g.events, "Subscriber", g.name)
        emit_gauge(metrics.BUS_BATCHES_QUEUED, g.batches, "Subscriber", g.name)
        emit_gauge(metrics.BUS_OLDEST_EVENT_AGE_MS, g.oldest_age_ms, "Subscriber", g.name)
        emit_gauge(metrics.BUS_SUBSCRIBER_HEALTH, g.health_points, "Subscriber", g.name)
    for q, states in t.jobs.items():
        for state, n in states.items():
            emit_gauge(metrics.BUS_JOBS, n, "QueueState", f"{q}:{state}")
    # Bus-wide figures without dimensions: what the alarms watch.
    emit_gauge(metrics.BUS_REDIS_USED_MEMORY, t.used_memory, "Bus", "all")
    lowest_health = min((g.health_points for g in t.subscribers), default=100)
    emit_gauge(metrics.BUS_MIN_SUBSCRIBER_HEALTH, lowest_health, "Bus", "all")
    oldest_age = max((g.oldest_age_ms for g in t.subscribers), default=0)
    emit_gauge(metrics.BUS_MAX_OLDEST_EVENT_AGE_MS, oldest_age, "Bus", "all")
    # Cumulative (Redis counters): whoever dropped, the alarm sees the increase (metric math DIFF).
    emit_gauge(metrics.BUS_EVENTS_AUTODROPPED_TOTAL, t.autodropped, "Bus", "all")


def run_aux_job(store: BusStorePort, job: str) -> object:
    """Run one housekeeping job by name."""
    if job == "autodrop":
        return autodrop(store)
    if job == "monitor":
        return telemetry(store)
    if job == "scrub":
        return scrub(store, store.settings.scrub_after_ms)
    raise UnknownJobError(f"unknown aux job {job!r}")


def aux_intervals(store: BusStorePort) -> dict[str, int]:
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


def housekeep(store: BusStorePort) -> HousekeepingOutcome:
    """One pass of everything periodic (the scheduled function's work): promote due jobs, scrub dead
    workers, autodrop, telemetry. Safe beside running workers: each step is one atomic script."""
    out = HousekeepingOutcome()
    out.promoted = sum(JobQueue(store, q).promote_due() for q in QUEUES)
    out.scrubbed_jobs, out.workers_forgotten = scrub(store, store.settings.scrub_after_ms)
    dropped = autodrop(store)
    out.events_autodropped, out.topics_dropped = dropped.events_dropped, dropped.topics_dropped
    out.subscribers = len(telemetry(store).subscribers)
    return out
