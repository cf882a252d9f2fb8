"""The activity tracker's logic: worker activity keeps a group Active.

A batch is reduced to one update per key, stamped with the tracker's own clock (the keyed RPC design warns
against trusting worker clocks). The key is the report's routing key (the keyed RPC design's worker protocol),
which the staging hop recorded in ``x-death``, or ``x-switchyard-key``. Any activity, however
rare, moves ``seen`` forward, so a group with occasional traffic stays up (the public osrdyne's
debounce did the opposite). A group found Unbound, or unknown (workers started by hand), becomes
Active under a new generation and its queue is declared and bound again, under the key's lock,
which the reconciler's stop also holds. A Stopped group stays stopped: a report that lands after
the stop is late, and starting workers again (ECS tasks cost money) is an orphan's call, not a
report's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from switchyard.core.observability import logger
from switchyard.rpc import protocol as p
from switchyard.rpc.control.rmq_event import AmqpMessage
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.ports import PoolStore
from switchyard.rpc.store import TouchMode, now_ms

_EVENTS = {e.value for e in p.Event}


@dataclass
class ActivityOutcome:
    events: int = 0
    keys: int = 0
    reactivated: int = 0
    late_for_stopped: int = 0
    without_key: int = 0
    unknown_events: int = 0
    malformed_fields: int = 0  # reports with a field the event could not carry (still used if keyed)


def track_activity(
    messages: Iterable[AmqpMessage], *, state: PoolStore, topology: PoolTopology, at_ms: int | None = None
) -> ActivityOutcome:
    outcome = ActivityOutcome()
    keys: set[str] = set()
    for message in messages:
        outcome.events += 1
        outcome.malformed_fields += bool(message.problems)
        key = message.key
        if key is None:
            outcome.without_key += 1
            worker_id = message.headers.get(p.WORKER_ID_HEADER)
            logger.warning("activity report without a usable key dropped",
                           extra={"pool": topology.pool, "worker_id": worker_id})
            continue
        if message.header_str(p.EVENT_HEADER) not in _EVENTS:
            outcome.unknown_events += 1
            logger.warning("activity report with an unknown x-event dropped",
                           extra={"pool": topology.pool, "event": repr(message.headers.get(p.EVENT_HEADER))})
            continue
        keys.add(key)
    outcome.keys = len(keys)
    at = at_ms or now_ms()
    touched = state.touch(keys, at, TouchMode.SEEN)  # the common case: Active groups, no locks
    others = [key for key, touch in touched.items() if touch.needs_lock]
    outcome.late_for_stopped = sum(touch.stopped for touch in touched.values())
    if others:
        with state.locked(others):
            touched = state.touch(others, at, TouchMode.ACTIVITY)
            reactivated = [key for key, touch in touched.items() if touch.became_active]
            outcome.late_for_stopped += sum(touch.stopped for touch in touched.values())
            if reactivated:
                topology.ensure_request_queues(reactivated, likely_new=reactivated)
        outcome.reactivated = len(reactivated)
    if outcome.late_for_stopped:
        logger.info("late activity for stopped groups ignored",
                    extra={"pool": topology.pool, "reports": outcome.late_for_stopped})
    return outcome
