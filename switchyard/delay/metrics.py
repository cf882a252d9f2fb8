"""The metric names the delay scheduler emits, defined once.

A stand-in holding only the names the alarms in stacks/ use: the part's own module replaces it."""

from __future__ import annotations

DELAY_MAX_TIMER_LATENESS = "DelayMaxTimerLateness"
DELAY_MESSAGES_OVERDUE = "DelayMessagesOverdue"
DELAY_MESSAGES_PARKED = "DelayMessagesParked"
DELAY_SUSPECTED_FAILURES = "DelaySuspectedFailures"
DELAY_PUBLISH_FAILURES = "DelayPublishFailures"
DELAY_STORE_ERRORS = "DelayStoreErrors"
DELAY_MESSAGES_ENQUEUED = "DelayMessagesEnqueued"
DELAY_MESSAGES_FIRED = "DelayMessagesFired"
DELAY_RECORDS_DROPPED = "DelayRecordsDropped"

EMITTED: frozenset[str] = frozenset({
    DELAY_MAX_TIMER_LATENESS,
    DELAY_MESSAGES_OVERDUE,
    DELAY_MESSAGES_PARKED,
    DELAY_SUSPECTED_FAILURES,
    DELAY_PUBLISH_FAILURES,
    DELAY_STORE_ERRORS,
    DELAY_MESSAGES_ENQUEUED,
    DELAY_MESSAGES_FIRED,
    DELAY_RECORDS_DROPPED,
})
