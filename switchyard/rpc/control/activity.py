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

A ``request-received`` report may carry the latency of the requests its worker answered
(``x-switchyard-latency``): the batch's summaries are kept in the pool's store, one write per
batch, for ``switchyard status`` and the console. A malformed one is counted and ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.control.rmq_event import AmqpMessage
from switchyard.rpc.ports import LatencyReport, PoolStore, RequestQueues, TouchMode, now_ms

_EVENTS = {e.value for e in protocol.Event}


@dataclass
class ActivityOutcome:
    events: int = 0
    keys: int = 0
    reactivated: int = 0
    late_for_stopped: int = 0
    without_key: int = 0
    undecodable: int = 0  # headers not decodable (amqp_decode): dropped, a report carries no answer
    unknown_events: int = 0
    malformed_fields: int = 0  # reports with a field the event could not carry (still used if keyed)
    latency_reports: int = 0  # latency summaries kept
    malformed_latency: int = 0  # an x-switchyard-latency that is not "count p50 p99 max": ignored


def parse_latency(raw: object) -> LatencyReport | None:
    """``count p50 p99 max`` (milliseconds) as a report, or None if it is not one."""
    if not isinstance(raw, str):
        return None
    parts = raw.split()
    try:
        count, figures = int(parts[0]), [float(x) for x in parts[1:]]
    except (ValueError, IndexError):
        return None
    if len(figures) != 3 or count < 1 or not all(0 <= x < 1e9 for x in figures):
        return None
    return LatencyReport(0, "", count, *figures)


def track_activity(
    messages: Iterable[AmqpMessage], *, state: PoolStore, topology: RequestQueues, at_ms: int | None = None
) -> ActivityOutcome:
    outcome = ActivityOutcome()
    keys: set[str] = set()
    at = at_ms or now_ms()
    latencies: list[LatencyReport] = []
    for message in messages:
        outcome.events += 1
        outcome.malformed_fields += bool(message.problems)
        if (reason := message.undecodable) is not None:
            outcome.undecodable += 1
            logger.warning("activity report with undecodable headers dropped",
                           extra={"pool": topology.pool, "reason": reason})
            continue
        key = message.key
        if key is None:
            outcome.without_key += 1
            worker_id = message.headers.get(protocol.WORKER_ID_HEADER)
            logger.warning("activity report without a usable key dropped",
                           extra={"pool": topology.pool, "worker_id": worker_id})
            continue
        if message.header_str(protocol.EVENT_HEADER) not in _EVENTS:
            outcome.unknown_events += 1
            logger.warning("activity report with an unknown x-event dropped",
                           extra={"pool": topology.pool,
                                  "event": repr(message.headers.get(protocol.EVENT_HEADER))})
            continue
        keys.add(key)
        if protocol.LATENCY_HEADER in message.headers:
            report = parse_latency(message.headers[protocol.LATENCY_HEADER])
            if report is None:
                outcome.malformed_latency += 1
            else:
                latencies.append(replace(report, at_ms=at, key=key))
    outcome.keys = len(keys)
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
    if latencies:
        state.record_latency(latencies)
        outcome.latency_reports = len(latencies)
    if outcome.late_for_stopped:
        logger.info("late activity for stopped groups ignored",
                    extra={"pool": topology.pool, "reports": outcome.late_for_stopped})
    return outcome
