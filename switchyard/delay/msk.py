"""From the MSK event (Powertools KafkaEvent) to InputRecords: bytes exactly as they were produced.

Uses the raw header list, not ``decoded_headers`` (a case-insensitive dict that would merge repeated
names and lose order); a missing or null key/value stays None.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

from aws_lambda_powertools.utilities.data_classes.kafka_event import KafkaEvent, KafkaEventRecord

from switchyard.delay.model import InputRecord


def _b64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def input_record(record: KafkaEventRecord) -> InputRecord:
    return InputRecord(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=_b64(record.get("key")),
        value=_b64(record.get("value")),
        headers=tuple(
            (name, bytes(value)) for chunk in record.get("headers") or [] for name, value in chunk.items()
        ),
    )


def records_from_kafka_event(event: KafkaEvent) -> Iterator[InputRecord]:
    """Every record of the event, in partition order as delivered."""
    for record in event.records:
        yield input_record(record)
