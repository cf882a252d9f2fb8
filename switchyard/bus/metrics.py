"""Every metric the event bus emits, named once: the API's publish count, the housekeeping gauges
(``housekeeping``), the worker's counters (``worker``) and the scheduled function's outcome
(``functions/bus_housekeeping.py``, ``emit_counts`` under ``HOUSEKEEPING_PREFIX``). The alarms in
``stacks/bus.py`` watch some of them: rename one here and there together."""

from __future__ import annotations

# -- the API ---------------------------------------------------------------------------------------
BUS_EVENTS_PUBLISHED = "BusEventsPublished"

# -- housekeeping gauges -----------------------------------------------------------------------------
BUS_EVENTS_AUTODROPPED = "BusEventsAutodropped"  # one autodrop run
BUS_EVENTS_AUTODROPPED_TOTAL = "BusEventsAutodroppedTotal"  # cumulative (Redis counters): alarm with DIFF
BUS_EVENTS_QUEUED = "BusEventsQueued"  # per subscriber
BUS_BATCHES_QUEUED = "BusBatchesQueued"
BUS_OLDEST_EVENT_AGE_MS = "BusOldestEventAgeMs"
BUS_SUBSCRIBER_HEALTH = "BusSubscriberHealth"
BUS_JOBS = "BusJobs"  # per queue and state
BUS_REDIS_USED_MEMORY = "BusRedisUsedMemory"  # bus-wide, what the alarms watch
BUS_MIN_SUBSCRIBER_HEALTH = "BusMinSubscriberHealth"
BUS_MAX_OLDEST_EVENT_AGE_MS = "BusMaxOldestEventAgeMs"

# -- the worker's counters, by the name it counts them under -----------------------------------------
BUS_DELIVERIES_OK = "BusDeliveriesOk"
BUS_DELIVERIES_FAIL = "BusDeliveriesFail"
BUS_DELIVERIES_WAIT = "BusDeliveriesWait"
BUS_DELIVERIES_GONE = "BusDeliveriesGone"
BUS_DELIVERIES_EMPTY = "BusDeliveriesEmpty"
BUS_DELIVERIES_BUSY = "BusDeliveriesBusy"
BUS_EVENTS_DELIVERED = "BusEventsDelivered"
BUS_AUX_JOBS = "BusAuxJobs"
BUS_JOB_ERRORS = "BusJobErrors"
BUS_THREADS_STARTED = "BusThreadsStarted"

WORKER_COUNTERS: dict[str, str] = {
    "deliveries_ok": BUS_DELIVERIES_OK,
    "deliveries_fail": BUS_DELIVERIES_FAIL,
    "deliveries_wait": BUS_DELIVERIES_WAIT,
    "deliveries_gone": BUS_DELIVERIES_GONE,
    "deliveries_empty": BUS_DELIVERIES_EMPTY,
    "deliveries_busy": BUS_DELIVERIES_BUSY,
    "events_delivered": BUS_EVENTS_DELIVERED,
    "aux_jobs": BUS_AUX_JOBS,
    "job_errors": BUS_JOB_ERRORS,
    "threads_started": BUS_THREADS_STARTED,
}

# -- the scheduled housekeeping function: emit_counts(HousekeepingOutcome, HOUSEKEEPING_PREFIX) --------
HOUSEKEEPING_PREFIX = "BusHousekeeping"
BUS_HOUSEKEEPING_PROMOTED = "BusHousekeepingPromoted"
BUS_HOUSEKEEPING_SCRUBBED_JOBS = "BusHousekeepingScrubbedJobs"
BUS_HOUSEKEEPING_WORKERS_FORGOTTEN = "BusHousekeepingWorkersForgotten"
BUS_HOUSEKEEPING_EVENTS_AUTODROPPED = "BusHousekeepingEventsAutodropped"
BUS_HOUSEKEEPING_TOPICS_DROPPED = "BusHousekeepingTopicsDropped"
BUS_HOUSEKEEPING_SUBSCRIBERS = "BusHousekeepingSubscribers"

EMITTED: frozenset[str] = frozenset(
    value for name, value in dict(globals()).items()
    if name.startswith("BUS_") and isinstance(value, str)
)
