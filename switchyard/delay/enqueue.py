"""Consuming and enqueuing (seed, operation 1): validate, fire the lapsed, store the rest in one transaction.

Returns only after the insert committed, so the event source commits offsets only for persisted
(or confirmed-published) records: a crash anywhere before that re-delivers the batch, which the
id's uniqueness makes harmless.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from switchyard.delay.errors import InvalidMessageError
from switchyard.delay.model import DelayedMessage, Drop, DropReason, EnqueueOutcome, InputRecord
from switchyard.delay.parsing import parse_record
from switchyard.delay.ports import DelayStore, Publisher
from switchyard.delay.settings import DelaySettings
from switchyard.observability import logger


def _validate(records: Iterable[InputRecord]) -> tuple[int, list[DelayedMessage], list[Drop], int]:
    """Split records into valid messages (first occurrence of each id) and drops; count in-batch repeats."""
    received, repeats = 0, 0
    valid: dict[str, DelayedMessage] = {}
    drops: list[Drop] = []
    for record in records:
        received += 1
        try:
            message = parse_record(record)
        except InvalidMessageError as exc:
            drop = Drop(record.topic, record.partition, record.offset, DropReason(exc.reason), exc.detail)
            logger.error(
                f"dropped record {record.position}: {exc}",
                extra={"topic": record.topic, "partition": record.partition, "offset": record.offset,
                       "reason": exc.reason},
            )
            drops.append(drop)
            continue
        if message.id in valid:
            repeats += 1
        else:
            valid[message.id] = message
    return received, list(valid.values()), drops, repeats


def _fire_now(messages: list[DelayedMessage], publisher: Publisher, timeout_s: float) -> list[DelayedMessage]:
    """Publish lapsed messages and wait for confirmations; returns those NOT confirmed."""
    for m in messages:
        publisher.send(m.key, m.value, m.headers, m.id)
    confirmed: set[object] = set()
    deadline = time.monotonic() + timeout_s
    while len(confirmed) < len(messages) and time.monotonic() < deadline:
        for d in publisher.poll(min(0.05, max(0.0, deadline - time.monotonic()))):
            if d.error is None:
                confirmed.add(d.token)
            else:
                logger.warning("immediate fire failed; storing the message instead",
                               extra={"message_id": d.token, "error": d.error})
    return [m for m in messages if m.id not in confirmed]


def enqueue_records(
    records: Iterable[InputRecord], store: DelayStore, publisher: Publisher, settings: DelaySettings,
) -> EnqueueOutcome:
    """Schedule one batch of input records. Raises StoreError (batch to be retried) if Postgres fails."""
    received, messages, drops, repeats = _validate(records)
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
    inserted = store.insert(to_store)
    return EnqueueOutcome(
        received=received,
        enqueued=len(inserted),
        duplicates=repeats + len(to_store) - len(inserted),
        fired_immediately=fired,
        dropped=tuple(drops),
    )
