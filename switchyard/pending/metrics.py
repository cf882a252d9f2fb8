"""The metrics the pending request queue emits, named once: the CDK alarms (``stacks/pending.py``)
and every emit site use these constants, so a rename cannot silently orphan an alarm.

Each is a Count with the dimension ``Endpoint`` (``*`` for data loss, which has no endpoint).
"""

from __future__ import annotations

from switchyard.core.observability import emit_gauge

PENDING_PICKUP_TIMEOUTS = "PendingPickupTimeouts"  # no polling service took the request in time
PENDING_PROCESSORS_LOST = "PendingProcessorsLost"  # the processing node went silent
PENDING_REQUESTS_REQUEUED = "PendingRequestsRequeued"  # popped, never claimed within the processor timeout
PENDING_RESPONSES_UNDELIVERED = "PendingResponsesUndelivered"  # abandoned / cancelled / gone
PENDING_DATA_LOSS_EVENTS = "PendingDataLossEvents"  # the data-loss guard vanished
PENDING_REQUESTS_DROPPED = "PendingRequestsDropped"  # a pending-list element no caller wrote (no id)

EMITTED: frozenset[str] = frozenset({
    PENDING_PICKUP_TIMEOUTS,
    PENDING_PROCESSORS_LOST,
    PENDING_REQUESTS_REQUEUED,
    PENDING_RESPONSES_UNDELIVERED,
    PENDING_DATA_LOSS_EVENTS,
    PENDING_REQUESTS_DROPPED,
})


def count(metric: str, endpoint: str = "*") -> None:
    """One occurrence of ``metric`` for ``endpoint``, flushed at once (its own dimension)."""
    emit_gauge(metric, 1, "Endpoint", endpoint)
