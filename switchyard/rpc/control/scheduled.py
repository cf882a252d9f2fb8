"""The scheduled-call relay: fired records of the delay scheduler's output topic into their pools.

A fired record that names a pool (``x-switchyard-pool``, switchyard/rpc/scheduling.py) becomes a
request published to ``{pool}-req-xchg`` with its key, mandatory, under publisher confirms, with the
call's id as AMQP ``message_id`` and ``correlation_id`` (workers deduplicate by it; answers are found
by it) and ``reply_to`` its durable reply queue, if it named one. A key without a group goes, as any
request does, through the pool's alternate exchange to the orphan path, which starts its group.
Records without a pool are not calls: they stay on the output topic for their own consumers.

Refused calls are counted and parked with the reason, never dropped:
- ``unknown_pool``: the pool's request exchange does not exist; the record goes to the delay store's
  ``parked_messages`` (``switchyard delay parked``), as does a record that cannot even be read;
- ``malformed`` (bad headers, or a request AMQP cannot carry: switchyard/rpc/frames.py, checked
  before publishing, since pika or the broker would fail the whole batch with it), ``expired`` (its
  ``x-switchyard-deadline-ms`` passed before it fired) and ``unroutable`` (returned by the broker):
  the pool's ``{pool}-poison`` queue, the reason in ``x-switchyard-poison-reason``, the record's
  headers as AMQP headers (a malformed one's pool must be valid and exist, and its copy must be one
  AMQP carries, else it is parked in the store). An expired call with a reply queue also gets an
  ``expired`` answer there, in the call's trace.

At least once: a record whose publish was nacked or whose connection failed, or whose parking failed,
is named in the partial batch response, and the mapping delivers its partition again from it (the
calls after it too: duplicates with the same message id, never losses).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import pika

from switchyard.core import tracing
from switchyard.core.errors import BrokerError, SwitchyardError
from switchyard.core.observability import logger
from switchyard.delay.model import Drop, InputRecord, RecordPosition
from switchyard.rpc import frames, protocol
from switchyard.rpc.control.publisher import Outgoing
from switchyard.rpc.errors import ScheduledCallError
from switchyard.rpc.scheduling import ScheduledCall, as_amqp, fired_pool, read_fired, request_properties


class Refusal:
    """Why a fired call was not made (the poison-reason header's and the parked row's first word)."""

    UNKNOWN_POOL = "unknown_pool"
    MALFORMED = "malformed"
    EXPIRED = "expired"
    UNROUTABLE = "unroutable"


class SettledPublisher(Protocol):
    """What the relay needs of the broker (``ConfirmingPublisher``)."""

    def publish_settled(self, messages: list[Outgoing], timeout: float = 30.0) -> list[str | None]: ...

    def exchange_exists(self, exchange: str) -> bool: ...

    def frame_max(self) -> int: ...


class ParkedStore(Protocol):
    """Where records for no pool are set aside (the delay store's ``parked_messages``)."""

    def park_records(self, records: list[tuple[InputRecord, str, str]]) -> None: ...


@dataclass
class ScheduledOutcome:
    """What one batch of fired records became; ``failed``: records to deliver again."""

    records: int = 0
    published: int = 0
    without_pool: int = 0
    unknown_pool: int = 0
    malformed: int = 0
    expired: int = 0
    unroutable: int = 0
    parked: int = 0
    publish_failures: int = 0  # records to deliver again: not handed to RabbitMQ, or not parked
    failed: tuple[RecordPosition, ...] = field(default=())


def _position(record: InputRecord | Drop) -> RecordPosition:
    return RecordPosition(record.topic, record.partition, record.offset)


def request_of(call: ScheduledCall, now_ms: int) -> Outgoing:
    """The request ``call`` becomes: mandatory, its id as message and correlation id."""
    return Outgoing(protocol.req_exchange(call.pool), protocol.routing_key(call.key), call.body,
                    request_properties(call, now_ms), mandatory=True)


def _poison(pool: str, record: InputRecord, reason: str, call_id: str | None) -> Outgoing:
    headers = as_amqp(record.headers)
    headers[protocol.POISON_REASON_HEADER] = reason
    props = pika.BasicProperties(message_id=_parked_id(record, call_id), headers=headers,
                                 delivery_mode=pika.DeliveryMode.Persistent)
    return Outgoing("", protocol.poison_queue(pool), record.value or b"", props, mandatory=True)


def _expired_answer(call: ScheduledCall, trace: tracing.TraceContext | None) -> Outgoing | None:
    """The relay's own answer, in the call's trace as a worker's answer would be (its span: a child)."""
    if call.reply_queue is None:
        return None
    headers: dict[str, str] = {protocol.STATUS_HEADER: protocol.Status.EXPIRED}
    if trace is not None:
        headers[tracing.TRACEPARENT_HEADER] = trace.child().traceparent
    props = pika.BasicProperties(correlation_id=call.id, headers=headers,
                                 content_type="application/json", delivery_mode=pika.DeliveryMode.Persistent)
    detail = {"reason": protocol.Status.EXPIRED, "key": call.key,
              "detail": "the call expired before it fired"}
    return Outgoing("", call.reply_queue, json.dumps(detail).encode(), props)


def _parked_id(record: InputRecord | Drop, call_id: str | None) -> str:
    return call_id if call_id is not None else f"{record.topic}/{record.partition}/{record.offset}"[:128]


def relay_scheduled(records: Iterable[InputRecord | Drop], *, publisher: SettledPublisher,
                    parked: ParkedStore, now_ms: int) -> ScheduledOutcome:
    """Publish every fired call of the batch into its pool; park the refused ones."""
    outcome = ScheduledOutcome()
    requests: list[tuple[InputRecord, ScheduledCall, Outgoing]] = []
    poison: list[tuple[InputRecord, Outgoing, bool]] = []  # bool: a parked copy (else an answer)
    to_park: list[tuple[InputRecord, str, str]] = []
    failed: list[RecordPosition] = []
    known: dict[str, bool] = {}

    def exists(pool: str) -> bool:
        if pool not in known:
            known[pool] = publisher.exchange_exists(protocol.req_exchange(pool))
        return known[pool]

    def refuse(record: InputRecord, pool: str | None, reason: str, detail: str, call_id: str | None) -> None:
        with tracing.scope_if(tracing.in_pairs(record.headers)):
            logger.warning("scheduled call refused", extra={"reason": reason, "detail": detail, "pool": pool,
                                                            "call_id": call_id, "position": record.position})
        copy = _poison(pool, record, f"{reason}: {detail}", call_id) if pool is not None and exists(pool)\
            else None
        if copy is not None and frames.fault(copy.properties, publisher.frame_max()) is None:
            poison.append((record, copy, True))
        else:  # no pool, or headers no AMQP message can carry: the store keeps the record as it came
            to_park.append((record, _parked_id(record, call_id), f"{reason}: {detail}"))

    def take(record: InputRecord) -> None:
        named = fired_pool(record)
        if named is None:
            outcome.without_pool += 1
            return
        try:
            call = read_fired(record)
        except ScheduledCallError as exc:
            outcome.malformed += 1
            pool = named if protocol.POOL_NAME_RE.match(named) else None
            refuse(record, pool, Refusal.MALFORMED, exc.detail, None)
            return
        if not exists(call.pool):
            outcome.unknown_pool += 1
            refuse(record, None, Refusal.UNKNOWN_POOL, f"no pool {call.pool!r} on the broker", call.id)
        elif call.expires_ms is not None and call.expires_ms <= now_ms:
            outcome.expired += 1
            late_ms = now_ms - call.expires_ms
            refuse(record, call.pool, Refusal.EXPIRED, f"expired {late_ms} ms before it fired", call.id)
            answer = _expired_answer(call, tracing.in_pairs(record.headers))
            if answer is not None:
                poison.append((record, answer, False))
        else:
            request = request_of(call, now_ms)
            problem = frames.fault(request.properties, publisher.frame_max())
            if problem is None:
                requests.append((record, call, request))
            else:  # it would fail the batch's every publish with it: refused alone
                outcome.malformed += 1
                refuse(record, call.pool, Refusal.MALFORMED, problem, call.id)

    for record in records:
        outcome.records += 1
        if isinstance(record, Drop):  # unreadable even as a record: parked by its position
            outcome.malformed += 1
            logger.warning("unreadable fired record", extra={"detail": record.detail})
            empty = InputRecord(record.topic, record.partition, record.offset, None, None, ())
            to_park.append((empty, _parked_id(record, None), f"{Refusal.MALFORMED}: {record.detail}"))
            continue
        try:
            take(record)
        except BrokerError as exc:  # the broker is not there (checking a pool): tried again
            logger.warning("cannot check the pool", extra={"error": str(exc), "position": record.position})
            outcome.publish_failures += 1
            failed.append(_position(record))

    if requests:
        sent_at = time.time()  # the hop's time: a warm worker may handle it before the confirm is in
        try:
            results = publisher.publish_settled([out for _, _, out in requests])
        except BrokerError as exc:
            logger.error("publishing scheduled calls failed",
                         extra={"error": str(exc), "calls": len(requests)})
            results = ["failed"] * len(requests)
        for (record, call, _), result in zip(requests, results, strict=True):
            if result is None:
                outcome.published += 1
                tracing.hop(tracing.in_pairs(record.headers), "rpc", "scheduled call published",
                            at=sent_at, pool=call.pool, key=call.key, id=call.id)
            elif result == "returned":
                outcome.unroutable += 1
                refuse(record, call.pool, Refusal.UNROUTABLE,
                       "the broker returned it: nothing routed its key", call.id)
            else:
                outcome.publish_failures += 1
                failed.append(_position(record))
    _park_all(poison, to_park, publisher, parked, outcome, failed)
    outcome.failed = tuple(failed)
    return outcome


def _park_all(poison: list[tuple[InputRecord, Outgoing, bool]], to_park: list[tuple[InputRecord, str, str]],
              publisher: SettledPublisher, parked: ParkedStore, outcome: ScheduledOutcome,
              failed: list[RecordPosition]) -> None:
    """Poison copies under confirms, then the store's rows; a record whose parking failed is retried."""
    if poison:
        try:
            results = publisher.publish_settled([out for _, out, _ in poison])
        except BrokerError as exc:
            logger.error("parking in poison queues failed", extra={"error": str(exc)})
            results = ["failed"] * len(poison)
        for (record, out, copy), result in zip(poison, results, strict=True):
            if result == "returned" and copy:  # no poison queue (a pool half deleted): the store keeps it
                reason = out.properties.headers[protocol.POISON_REASON_HEADER]
                to_park.append((record, str(out.properties.message_id), reason))
            elif result is not None:
                outcome.publish_failures += 1
                failed.append(_position(record))
            elif copy:
                outcome.parked += 1
    if to_park:
        try:
            parked.park_records(to_park)
            outcome.parked += len(to_park)
        except SwitchyardError as exc:
            logger.error("parking fired records failed", extra={"error": str(exc)})
            outcome.publish_failures += len(to_park)
            failed.extend(_position(record) for record, _, _ in to_park)
