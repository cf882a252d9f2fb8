"""The scheduler's data: Chronos protocol constants, records in, rows stored, outcomes returned."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

# The two headers every input record must carry (case-sensitive, as Kafka header names are).
MESSAGE_ID_HEADER = "chronosMessageId"
DEADLINE_HEADER = "chronosDeadline"
CHRONOS_HEADERS = frozenset({MESSAGE_ID_HEADER, DEADLINE_HEADER})
MAX_MESSAGE_ID_LENGTH = 128  # characters, as the seed's varchar(128)

Header = tuple[str, bytes | None]


class DropReason(enum.StrEnum):
    """Why an input record was dropped instead of scheduled."""

    MISSING_MESSAGE_ID = "missing_message_id"
    """No chronosMessageId header."""
    MISSING_DEADLINE = "missing_deadline"
    """No chronosDeadline header."""
    DUPLICATE_HEADER = "duplicate_header"
    """A Chronos header appears more than once, so which one is meant is unknown."""
    INVALID_MESSAGE_ID = "invalid_message_id"
    """Empty, longer than 128 characters, not UTF-8, or containing NUL."""
    INVALID_DEADLINE = "invalid_deadline"
    """Not UTF-8 or not one of the accepted ISO-8601 forms."""
    INVALID_HEADER_NAME = "invalid_header_name"
    """Another header's name contains NUL or is not valid Unicode (Postgres and Kafka cannot carry it)."""
    MALFORMED_RECORD = "malformed_record"
    """The event record itself is broken: a field missing or of the wrong type, bad base64, header
    bytes out of range, or anything else that fails while reading one record."""
    UNSTORABLE = "unstorable"
    """Postgres refused the message's own data (a data or integrity error): retrying cannot help."""


@dataclass(frozen=True)
class InputRecord:
    """One record of the input topic, as the event source delivered it (bytes, nothing parsed)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]

    @property
    def position(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"


@dataclass(frozen=True)
class DelayedMessage:
    """A valid Chronos message: its id and deadline, and what will be relayed (Chronos headers removed)."""

    id: str
    deadline: datetime
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


@dataclass(frozen=True)
class ReadyMessage:
    """A row readied by this node; ``seq`` and ``readied_at`` identify this very row for delete/release."""

    id: str
    seq: int
    deadline: datetime
    readied_at: datetime
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


@dataclass(frozen=True)
class StuckMessage:
    """A row readied longer ago than the hold time, with the values the compare-and-set must match."""

    id: str
    readied_at: datetime
    readied_by: str


class ParkedMessage(NamedTuple):
    """A message refused for good, as ``switchyard delay parked`` shows it: what a person needs to
    fix the cause before a replay. ``value`` is the first bytes of it (``size`` is the whole)."""

    id: str
    deadline: datetime
    parked_at: datetime
    reason: str
    size: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


@dataclass(frozen=True)
class Drop:
    """A record dropped for bad input: where it was and why."""

    topic: str
    partition: int
    offset: int
    reason: DropReason
    detail: str


@dataclass(frozen=True)
class RecordPosition:
    """Where a record is in the input topic (what a partial batch response names)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class EnqueueOutcome:
    """What one batch of input records became.

    ``failed``: records not stored for a transient reason, to be delivered again (the event source
    re-delivers each partition from its first failed record); every other record is settled.
    """

    received: int = 0
    enqueued: int = 0
    duplicates: int = 0
    fired_immediately: int = 0
    dropped: tuple[Drop, ...] = field(default=())
    failed: tuple[RecordPosition, ...] = field(default=())


@dataclass
class FireOutcome:
    """What one ready-and-fire run did (the fire loop counts into one, and hands out copies)."""

    readied: int = 0
    fired: int = 0
    deleted: int = 0
    gone_at_delete: int = 0
    publish_failures: int = 0
    released: int = 0
    parked: int = 0  # refused by the broker for good: moved to parked_messages, never retried
    store_errors: int = 0
    max_late_ms: float = 0.0
    overdue: int = 0  # at the end of the run: waiting rows due over OVERDUE_AFTER_S ago (-1: unknown)


@dataclass(frozen=True)
class LatenessWindow:
    """How late one fire loop published the rows it fired in a window (about ten seconds): nearest-rank
    percentiles, in milliseconds past each row's firing time."""

    fired: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class SweepOutcome:
    """What failure detection found and reset."""

    scans: int = 0
    suspected: int = 0
    reset: int = 0
    store_errors: int = 0
