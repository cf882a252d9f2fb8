"""The metric names the event bus emits, defined once.

A stand-in holding only the names the alarms in stacks/ use: the part's own module replaces it."""

from __future__ import annotations

BUS_EVENTS_AUTODROPPED_TOTAL = "BusEventsAutodroppedTotal"
BUS_MIN_SUBSCRIBER_HEALTH = "BusMinSubscriberHealth"
BUS_MAX_OLDEST_EVENT_AGE_MS = "BusMaxOldestEventAgeMs"

EMITTED: frozenset[str] = frozenset({
    BUS_EVENTS_AUTODROPPED_TOTAL,
    BUS_MIN_SUBSCRIBER_HEALTH,
    BUS_MAX_OLDEST_EVENT_AGE_MS,
})
