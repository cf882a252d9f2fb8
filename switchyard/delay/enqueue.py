"""Consuming and enqueuing (seed, operation 1): validate, fire the lapsed, store the rest in one transaction.

Returns only after the insert committed, so the event source commits offsets only for persisted
(or confirmed-published) records: a crash anywhere before that re-delivers the batch, which the
id's uniqueness makes harmless. A record that could not be stored for a transient reason comes
back in ``failed`` (the partial batch response): the event source commits each partition only up
to its first failed record, so the guarantee holds record by record. A bad record is a drop.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from switchyard.core import tracing
from switchyard.core.observability import logger
from switchyard.delay.errors import (
    BrokerError,
    InvalidMessageError,
    StoreError,
    StoreUnavailableError,
    UnstorableMessageError,
)
from switchyard.delay.model import (
    DelayedMessage,
    Drop,
    DropReason,
    EnqueueOutcome,
    InputRecord,
    RecordPosition,
)
from switchyard.delay.parsing import parse_record
from switchyard.delay.ports import DelayStore, Publisher
from switchyard.delay.settings import DelaySettings


def _drop(drop: Drop, drops: list[Drop], exc_info: bool = False,
          headers: Sequence[tuple[str, Any]] = ()) -> None:
    """Log (ERROR, naming topic/partition/offset, in the record's trace if its ``headers`` name a
    valid one) and keep one dropped record; it is counted by the caller."""
    with tracing.scope_if(tracing.in_pairs(headers)):
        logger.error(
            f"dropped record {drop.topic}/{drop.partition}/{drop.offset}: {drop.reason}: {drop.detail}",
            extra={"topic": drop.topic, "partition": drop.partition, "offset": drop.offset,
                   "reason": drop.reason},
            exc_info=exc_info,
        )
    drops.append(drop)


def _safe_headers(record: InputRecord) -> Sequence[tuple[str, Any]]:
    """The record's headers if they are a list of pairs (a record that failed to parse may not be)."""
    headers = record.headers
    if isinstance(headers, tuple | list) and all(isinstance(h, tuple) and len(h) == 2 for h in headers):
        return headers
    return ()


def _validate(records: Iterable[InputRecord | Drop],
              ) -> tuple[int, dict[str, DelayedMessage], dict[str, InputRecord], list[Drop], int]:
    """Split records into valid messages (first occurrence of each id, with its record) and drops.

    Nothing one record holds can raise out of here: whatever fails while reading it is its drop.
    """
    received, repeats = 0, 0
    valid: dict[str, DelayedMessage] = {}
    sources: dict[str, InputRecord] = {}
    drops: list[Drop] = []
    for record in records:
        received += 1
        if isinstance(record, Drop):  # the event source could not even read it
            _drop(record, drops)
            continue
        try:
            message = parse_record(record)
        except InvalidMessageError as exc:
            reason = DropReason(exc.reason)
            _drop(Drop(record.topic, record.partition, record.offset, reason, exc.detail), drops,
                  headers=_safe_headers(record))
            continue
        except Exception as exc:  # a parser bug must not hold the partition back: drop, with the trace
            _drop(Drop(record.topic, record.partition, record.offset, DropReason.MALFORMED_RECORD,
                       f"{type(exc).__name__}: {exc}"[:300]), drops, exc_info=True,
                  headers=_safe_headers(record))
            continue
        if message.id in valid:
            repeats += 1
        else:
            valid[message.id] = message
            sources[message.id] = record
    return received, valid, sources, drops, repeats


def _fire_now(messages: list[DelayedMessage], publisher: Publisher[str],
              timeout_s: float) -> list[DelayedMessage]:
    """Publish lapsed messages and wait for confirmations; returns those NOT confirmed."""
    sent: list[DelayedMessage] = []
    for m in messages:
        try:
            publisher.send(m.key, m.value, m.headers, m.id)
            sent.append(m)
        except BrokerError as exc:  # refused at once (e.g. too large): it goes to the store like the others
            logger.warning("immediate fire refused; storing the message instead",
                           extra={"message_id": m.id, "error": str(exc)})
    confirmed: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while len(confirmed) < len(sent) and time.monotonic() < deadline:
        for d in publisher.poll(min(0.05, max(0.0, deadline - time.monotonic()))):
            if d.error is None:
                confirmed.add(d.token)
            else:
                logger.warning("immediate fire failed; storing the message instead",
                               extra={"message_id": d.token, "error": d.error})
    return [m for m in messages if m.id not in confirmed]


def _isolate(messages: Sequence[DelayedMessage], error: StoreError, sources: dict[str, InputRecord],
             store: DelayStore, drops: list[Drop]) -> tuple[set[str], list[RecordPosition]]:
    """The batch insert failed with ``error``: find the records that fail by halving, storing the rest.

    Halving costs about 2 log2(n) inserts (one commit each) per bad record, where one insert per
    record cost n commits (10 s for 1,000 records on a busy machine). A message whose data Postgres
    refuses is dropped (logged, counted); one that fails for a transient or unknown reason is
    returned as failed, to be delivered again (never dropped on a guess). If nothing at all could
    be settled, the batch fails as a whole, as before.
    """
    inserted: set[str] = set()
    failed: list[RecordPosition] = []
    settled = 0
    stack: list[tuple[Sequence[DelayedMessage], StoreError]] = [(messages, error)]
    while stack:
        part, exc = stack.pop()
        if len(part) == 1:
            src = sources[part[0].id]
            if isinstance(exc, UnstorableMessageError):
                detail = str(exc)[:300]
                _drop(Drop(src.topic, src.partition, src.offset, DropReason.UNSTORABLE, detail), drops,
                      headers=part[0].headers)
                settled += 1
            else:
                failed.append(RecordPosition(src.topic, src.partition, src.offset))
            continue
        mid = len(part) // 2
        for half in (part[mid:], part[:mid]):
            try:
                inserted |= store.insert(half)
                settled += len(half)
            except StoreUnavailableError:
                raise  # Postgres is gone: the whole batch comes again (what was inserted is a no-op then)
            except StoreError as half_error:
                stack.append((half, half_error))
    if failed and not settled:
        raise error
    if failed:
        failed.sort(key=lambda p: (p.topic, p.partition, p.offset))
        logger.warning(f"{len(failed)} records not stored; reported as batch item failures (delivered again)",
                       extra={"positions": [f"{p.topic}/{p.partition}/{p.offset}" for p in failed[:10]],
                              "error": str(error)})
    return inserted, failed


def enqueue_records(
    records: Iterable[InputRecord | Drop], store: DelayStore, publisher: Publisher[str],
    settings: DelaySettings,
) -> EnqueueOutcome:
    """Schedule one batch of input records.

    Happy path: one binary COPY + INSERT for the whole batch. If that fails for any reason but an
    unreachable Postgres, the batch is halved until the failing records are isolated; those that
    fail transiently come back in ``failed`` (the partial batch response). Raises StoreError if
    nothing could be stored.
    """
    received, valid, sources, drops, repeats = _validate(records)
    messages = list(valid.values())
    cutoff = time.time() + settings.timing_advance_ms / 1000
    lapsed = [m for m in messages if m.deadline.timestamp() <= cutoff]
    fired = 0
    to_store = [m for m in messages if m.deadline.timestamp() > cutoff]
    if lapsed:
        stored = store.existing_ids([m.id for m in lapsed])  # already waiting: it fires from the store
        late = [m for m in lapsed if m.id not in stored]
        # Anything the broker did not confirm goes to the store instead: it is due, so the
        # ready-and-fire loop publishes it at once; nothing is lost if the broker is down.
        unconfirmed = _fire_now(late, publisher, settings.publish_timeout_ms / 1000) if late else []
        fired = len(late) - len(unconfirmed)
        repeats += len(lapsed) - len(late)
        to_store.extend(unconfirmed)
    failed: list[RecordPosition] = []
    try:
        inserted = store.insert(to_store)
    except StoreUnavailableError:
        raise
    except StoreError as exc:
        logger.warning("batch insert failed; isolating the records that fail", extra={"error": str(exc)})
        inserted, failed = _isolate(to_store, exc, sources, store, drops)
    if tracing.trace_log_path() is not None:  # the local trace log's hops (``switchyard trace``)
        stored_now = {m.id for m in to_store}
        for m in messages:
            event = "stored" if m.id in inserted else "fired at once" if m.id not in stored_now else ""
            if event:
                tracing.hop(tracing.in_pairs(m.headers), "delay", event, id=m.id,
                            deadline=m.deadline.isoformat())
    unsettled = len(failed) + sum(1 for d in drops if d.reason is DropReason.UNSTORABLE)
    return EnqueueOutcome(
        received=received,
        enqueued=len(inserted),
        duplicates=repeats + len(to_store) - len(inserted) - unsettled,
        fired_immediately=fired,
        dropped=tuple(drops),
        failed=tuple(failed),
    )
