"""Pure parsing of input records: Chronos headers, deadline formats, header (de)serialisation.

Accepted ``chronosDeadline`` values (UTF-8): ISO-8601 / RFC 3339 extended date-time
``YYYY-MM-DDTHH:MM:SS[.fraction]`` (``T``, ``t`` or a space between date and time; 1-9
fraction digits, truncated to microseconds) followed by an optional offset ``Z``, ``+HH:MM``,
``+HHMM`` or ``+HH``. A timestamp without an offset (the seed's own example) is UTC.
Anything else (dates alone, epoch numbers, week dates, missing seconds) is rejected.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta, timezone

from switchyard.delay.errors import InvalidMessageError
from switchyard.delay.model import (
    DEADLINE_HEADER,
    MAX_MESSAGE_ID_LENGTH,
    MESSAGE_ID_HEADER,
    DelayedMessage,
    DropReason,
    Header,
    InputRecord,
)

_DEADLINE_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2})(?::?(\d{2}))?)?$"
)


def parse_deadline(text: str) -> datetime:
    """Parse an accepted deadline string into an aware UTC datetime (ValueError if not accepted)."""
    m = _DEADLINE_RE.match(text.strip())
    if not m:
        raise ValueError(f"not an ISO-8601 date-time with seconds: {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    micros = int((m.group(7) or "0")[:6].ljust(6, "0"))
    tz = UTC
    if m.group(9):
        off_h, off_m = int(m.group(10)), int(m.group(11) or 0)
        if off_h > 23 or off_m > 59:
            raise ValueError(f"invalid UTC offset in {text!r}")
        sign = -1 if m.group(9) == "-" else 1
        tz = timezone(sign * timedelta(hours=off_h, minutes=off_m))
    try:
        return datetime(year, month, day, hour, minute, second, micros, tzinfo=tz).astimezone(UTC)
    except ValueError as exc:
        raise ValueError(f"invalid date-time {text!r}: {exc}") from exc


def format_deadline(deadline: datetime) -> str:
    """The canonical form this package writes: UTC with milliseconds and ``Z``."""
    return deadline.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _single(headers: Iterable[Header], name: str, missing: DropReason) -> bytes:
    values = [v for k, v in headers if k == name]
    if not values:
        raise InvalidMessageError(missing.value, f"no {name} header")
    if len(values) > 1:
        raise InvalidMessageError(DropReason.DUPLICATE_HEADER.value, f"{len(values)} {name} headers")
    return values[0] or b""


def parse_record(record: InputRecord) -> DelayedMessage:
    """Validate a record's Chronos headers and split them off; InvalidMessageError says why not."""
    raw_id = _single(record.headers, MESSAGE_ID_HEADER, DropReason.MISSING_MESSAGE_ID)
    raw_deadline = _single(record.headers, DEADLINE_HEADER, DropReason.MISSING_DEADLINE)
    try:
        message_id = raw_id.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessageError(DropReason.INVALID_MESSAGE_ID.value, "chronosMessageId not UTF-8") from exc
    if not message_id or len(message_id) > MAX_MESSAGE_ID_LENGTH or "\x00" in message_id:
        raise InvalidMessageError(
            DropReason.INVALID_MESSAGE_ID.value,
            f"chronosMessageId must be 1-{MAX_MESSAGE_ID_LENGTH} chars without NUL, got {message_id[:40]!r}",
        )
    try:
        deadline = parse_deadline(raw_deadline.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidMessageError(DropReason.INVALID_DEADLINE.value, f"chronosDeadline: {exc}") from exc
    relayed = tuple((k, v) for k, v in record.headers if k not in (MESSAGE_ID_HEADER, DEADLINE_HEADER))
    for name, _ in relayed:
        if "\x00" in name:
            raise InvalidMessageError(DropReason.INVALID_HEADER_NAME.value, f"header {name!r} contains NUL")
    return DelayedMessage(message_id, deadline, record.key, record.value, relayed)


def headers_to_json(headers: Iterable[Header]) -> str:
    """Headers as stored: the seed's ``[{"name": "value"}, ...]``, values base64 (bytes kept exactly)."""
    return json.dumps(
        [{k: None if v is None else base64.b64encode(v).decode("ascii")} for k, v in headers],
        separators=(",", ":"),
    )


def headers_from_json(stored: list[dict[str, str | None]]) -> tuple[Header, ...]:
    """Inverse of headers_to_json (order and repeated names preserved)."""
    return tuple(
        (k, None if v is None else base64.b64decode(v)) for item in stored for k, v in item.items()
    )
