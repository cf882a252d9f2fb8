"""The metric names the pending request queue emits, defined once.

A stand-in holding only the names the alarms in stacks/ use: the part's own module replaces it."""

from __future__ import annotations

PENDING_PICKUP_TIMEOUTS = "PendingPickupTimeouts"
PENDING_RESPONSES_UNDELIVERED = "PendingResponsesUndelivered"
PENDING_PROCESSORS_LOST = "PendingProcessorsLost"
PENDING_DATA_LOSS_EVENTS = "PendingDataLossEvents"

EMITTED: frozenset[str] = frozenset({
    PENDING_PICKUP_TIMEOUTS,
    PENDING_RESPONSES_UNDELIVERED,
    PENDING_PROCESSORS_LOST,
    PENDING_DATA_LOSS_EVENTS,
})
