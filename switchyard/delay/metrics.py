"""The delay scheduler's metrics: every name defined once, and each outcome's report.

The three handlers (``functions/delay_*.py``) report what their run returned through one function
per outcome here, so a name is typed in one place; the alarms in ``stacks/`` select on the same
names (service ``switchyard-delay``). Each ``*_FIELDS`` table maps an outcome field to its metric:
a test checks every field exists on its outcome class and every name is in ``EMITTED``, so renaming
a field fails a test, not an alarm.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_lambda_powertools.metrics import MetricUnit

from switchyard.core.observability import metrics
from switchyard.delay.model import EnqueueOutcome, FireOutcome, SweepOutcome

# consume and enqueue (EnqueueOutcome)
DELAY_RECORDS_RECEIVED = "DelayRecordsReceived"
DELAY_MESSAGES_ENQUEUED = "DelayMessagesEnqueued"
DELAY_DUPLICATES_IGNORED = "DelayDuplicatesIgnored"
DELAY_FIRED_IMMEDIATELY = "DelayFiredImmediately"
DELAY_RECORDS_DROPPED = "DelayRecordsDropped"
DELAY_RECORDS_RETRIED = "DelayRecordsRetried"
# ready and fire (FireOutcome)
DELAY_MESSAGES_READIED = "DelayMessagesReadied"
DELAY_MESSAGES_FIRED = "DelayMessagesFired"
DELAY_MESSAGES_GONE_AT_DELETE = "DelayMessagesGoneAtDelete"
DELAY_PUBLISH_FAILURES = "DelayPublishFailures"
DELAY_MESSAGES_PARKED = "DelayMessagesParked"
DELAY_STORE_ERRORS = "DelayStoreErrors"  # fire and sweep alike
DELAY_MAX_TIMER_LATENESS = "DelayMaxTimerLateness"
DELAY_MESSAGES_OVERDUE = "DelayMessagesOverdue"
# failure detection (SweepOutcome)
DELAY_SUSPECTED_FAILURES = "DelaySuspectedFailures"

# Outcome field -> metric, in the order they are reported. A tuple field counts its items.
ENQUEUE_FIELDS: Mapping[str, str] = {
    "received": DELAY_RECORDS_RECEIVED,
    "enqueued": DELAY_MESSAGES_ENQUEUED,
    "duplicates": DELAY_DUPLICATES_IGNORED,
    "fired_immediately": DELAY_FIRED_IMMEDIATELY,
    "dropped": DELAY_RECORDS_DROPPED,
    "failed": DELAY_RECORDS_RETRIED,
}
FIRE_FIELDS: Mapping[str, str] = {
    "readied": DELAY_MESSAGES_READIED,
    "fired": DELAY_MESSAGES_FIRED,
    "gone_at_delete": DELAY_MESSAGES_GONE_AT_DELETE,
    "publish_failures": DELAY_PUBLISH_FAILURES,
    "parked": DELAY_MESSAGES_PARKED,
    "store_errors": DELAY_STORE_ERRORS,
    "max_late_ms": DELAY_MAX_TIMER_LATENESS,
    "overdue": DELAY_MESSAGES_OVERDUE,
}
SWEEP_FIELDS: Mapping[str, str] = {
    "reset": DELAY_SUSPECTED_FAILURES,
    "store_errors": DELAY_STORE_ERRORS,
}
REPORTED: Mapping[type, Mapping[str, str]] = {
    EnqueueOutcome: ENQUEUE_FIELDS,
    FireOutcome: FIRE_FIELDS,
    SweepOutcome: SWEEP_FIELDS,
}

EMITTED: frozenset[str] = frozenset({
    DELAY_RECORDS_RECEIVED, DELAY_MESSAGES_ENQUEUED, DELAY_DUPLICATES_IGNORED, DELAY_FIRED_IMMEDIATELY,
    DELAY_RECORDS_DROPPED, DELAY_RECORDS_RETRIED, DELAY_MESSAGES_READIED, DELAY_MESSAGES_FIRED,
    DELAY_MESSAGES_GONE_AT_DELETE, DELAY_PUBLISH_FAILURES, DELAY_MESSAGES_PARKED, DELAY_STORE_ERRORS,
    DELAY_MAX_TIMER_LATENESS, DELAY_MESSAGES_OVERDUE, DELAY_SUSPECTED_FAILURES,
})

_UNITS: Mapping[str, MetricUnit] = {DELAY_MAX_TIMER_LATENESS: MetricUnit.Milliseconds}
# A count the run could not take (-1) is left out rather than reported as a value.
_UNKNOWN_WHEN_NEGATIVE = frozenset({DELAY_MESSAGES_OVERDUE})


def _report(outcome: object, fields: Mapping[str, str]) -> None:
    for field, name in fields.items():
        value = getattr(outcome, field)
        if isinstance(value, tuple):
            value = len(value)
        if name in _UNKNOWN_WHEN_NEGATIVE and value < 0:
            continue
        metrics.add_metric(name=name, unit=_UNITS.get(name, MetricUnit.Count), value=value)


def report_enqueue(outcome: EnqueueOutcome) -> None:
    """One batch's counts: received, stored, duplicates, fired at once, dropped, to be delivered again."""
    _report(outcome, ENQUEUE_FIELDS)


def report_fire(outcome: FireOutcome) -> None:
    """One ready-and-fire run: its counts, its worst timer lateness, the backlog it left (when known)."""
    _report(outcome, FIRE_FIELDS)


def report_sweep(outcome: SweepOutcome) -> None:
    """One failure-detection run: the rows it reset (each a suspected failure) and its store errors."""
    _report(outcome, SWEEP_FIELDS)
