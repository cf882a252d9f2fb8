"""From the MSK event (Powertools KafkaEvent) to InputRecords, and back to the partial batch response.

Uses the raw header list, not ``decoded_headers`` (a case-insensitive dict that would merge repeated
names and lose order); a missing or null key/value stays None.

Header values arrive as JSON arrays of Java's *signed* bytes: 0x80-0xFF come as -128..-1 (a
non-ASCII message id, a binary tracing context), and a null header value as ``null``. Both are
decoded. A record that cannot be read (a field missing or of the wrong type, bad base64, a byte out
of range) becomes a ``Drop`` naming its position, never an exception for the whole batch.

The handler's entry is the Powertools ``KafkaEvent``; records are read from its raw dict rather than
through a ``KafkaEventRecord`` wrapper per record (the wrapper's property lookups cost more than the
decoding at 10,000 records/s). The order is the wrapper's: partition chunks as delivered.
"""

from __future__ import annotations

from array import array
from binascii import a2b_base64
from collections.abc import Iterable, Iterator
from typing import Any

from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.kafka_event import KafkaEvent

from switchyard.core.errors import MalformedEventError
from switchyard.delay.model import Drop, DropReason, Header, InputRecord, RecordPosition

# What reading one malformed record can raise (binascii.Error and UnicodeError are ValueErrors).
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError)


def _b64(text: str | None) -> bytes | None:
    # a2b_base64 is what base64.b64decode (validate=False) calls, without its argument checks.
    return None if text is None else a2b_base64(text)


def header_value(value: list[int] | None) -> bytes | None:
    """A header value as Lambda sends it (signed bytes, or null) as the bytes that were produced."""
    if value is None:
        return None
    if type(value) is not list:  # bytes(5) or bytes({...}) would "succeed" with the wrong bytes
        raise TypeError(f"header value must be an array of bytes or null, got {type(value).__name__}")
    try:
        return bytes(value)  # 0..127 only: ASCII, the common case, in C
    except ValueError:
        return array("b", value).tobytes()  # Java's signed bytes; OverflowError outside -128..127


def _headers(chunks: Iterable[dict[str, list[int] | None]]) -> tuple[Header, ...]:
    """The record's headers in order; ``header_value`` inlined for arrays (this runs per header)."""
    out: list[Header] = []
    for chunk in chunks:
        for name, value in chunk.items():
            if type(value) is list:
                try:
                    out.append((name, bytes(value)))
                except ValueError:
                    out.append((name, array("b", value).tobytes()))
            else:
                out.append((name, header_value(value)))
    return tuple(out)


def _from_raw(record: dict[str, Any]) -> InputRecord:
    topic, partition, offset = record["topic"], record["partition"], record["offset"]
    if type(topic) is not str or type(partition) is not int or type(offset) is not int:
        raise TypeError("topic must be a string, partition and offset integers")
    return InputRecord(topic, partition, offset, _b64(record.get("key")), _b64(record.get("value")),
                       _headers(record.get("headers") or ()))


def _malformed(record: object, exc: Exception) -> Drop:
    """A Drop for a record that could not be read, positioned as well as the record allows."""
    fields = record if isinstance(record, dict) else {}
    topic, partition, offset = fields.get("topic"), fields.get("partition"), fields.get("offset")
    return Drop(
        topic if type(topic) is str else repr(topic),
        partition if type(partition) is int else -1,
        offset if type(offset) is int else -1,
        DropReason.MALFORMED_RECORD,
        f"{type(exc).__name__}: {exc}"[:300],
    )


def records_from_kafka_event(event: KafkaEvent) -> Iterator[InputRecord | Drop]:
    """Every record of the event, in partition order as delivered; unreadable ones as Drops.

    An event whose ``records`` is not an object of partitions raises ``MalformedEventError`` (no
    mapping sends one); a partition's entry that is not a list is one unreadable record."""
    chunks = event["records"]  # missing: KeyError from the wrapper (the CLI names the field)
    if not isinstance(chunks, dict):
        raise MalformedEventError("not an aws:kafka event: expected an object whose records map "
                                  f"'<topic>-<partition>' to a list of records, got {type(chunks).__name__}")
    for chunk in chunks.values():
        if not isinstance(chunk, list):
            yield _malformed({}, TypeError(f"a partition's records are a {type(chunk).__name__}, not a list"))
            continue
        for record in chunk:
            try:
                yield _from_raw(record)
            except _MALFORMED as exc:
                yield _malformed(record, exc)


def partial_batch_response(failed: Iterable[RecordPosition]) -> PartialItemFailureResponse:
    """The ``ReportBatchItemFailures`` response: Powertools' Kafka item identifier for each failed record.

    The event source mapping re-delivers each named partition from its lowest failed offset (later
    records of that partition come again too) and commits what precedes it.
    """
    return {"batchItemFailures": [
        {"itemIdentifier": {"partition": f"{p.topic}-{p.partition}", "offset": p.offset}} for p in failed
    ]}
