"""What a lost connection does to the calls in flight: they are sent again on the next one.

At-least-once. A call published on the lost connection can no longer be answered there (its reply
queue was exclusive to that connection), and an unconfirmed one may not have reached the broker, so
each is published again, with the same correlation id and a new reply-to, if its deadline has not
passed; a worker may handle it twice. The correlation id (``<client tag>.<slot>.<seq>``, the tag
random per client) is the same both times and names one call of one client: a worker can dedupe by
it, though none does today (a handler that must not run twice needs an id of its own in the body).
A call whose deadline passes before a connection takes it fails with ``CallInterruptedError``
(retryable). A ``send`` on a client without confirms is settled once written, so never re-sent.
"""

from __future__ import annotations

import time

from switchyard.rpc.client.requests import Call
from switchyard.rpc.client.response import ClientStats
from switchyard.rpc.client.slots import SlotTable
from switchyard.rpc.errors import CallInterruptedError


def published_in_flight(slots: SlotTable[Call]) -> list[Call]:
    """The calls in flight that were taken out of the outbox for a connection, oldest first: those
    a lost connection leaves unanswered (the others are still in the outbox)."""
    return [call for call in slots.live() if call.published_on and not call.future.done()]


def interrupt_overdue(slots: SlotTable[Call], stats: ClientStats, why: Exception, wait: float) -> float:
    """While no connection serves: fail the calls in flight past their deadline with the retryable
    ``CallInterruptedError``. Returns the earliest deadline still to come, at most ``wait`` s away."""
    now = time.monotonic()
    earliest = now + wait
    for call in slots.live():
        if call.deadline > now:
            earliest = min(earliest, call.deadline)
        elif slots.complete(call.slot, call.seq) is not None:
            stats.interrupted += 1
            call.future.set_exception(CallInterruptedError(
                f"the connection to RabbitMQ was lost with the request for key {call.key!r} in flight, "
                f"and none could re-send it within its {call.timeout:.3g}s ({why!r}); it may have "
                "been handled: retry it if the handler may run twice"))
    return earliest
