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


# The form format_deadline writes (and most producers send): UTC, "T", 0, 3 or 6 fraction digits, "Z".
# For it, datetime.fromisoformat (C) gives the same value as the general parser, six times faster.
_CANONICAL_RE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{3}|\.[0-9]{6})?Z")


def parse_deadline(text: str) -> datetime:
    """Parse an accepted deadline string into an aware UTC datetime (ValueError if not accepted)."""
    if _CANONICAL_RE.fullmatch(text):
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            pass  # e.g. month 13: the general parser below says why
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
    except (ValueError, OverflowError) as exc:  # OverflowError: 9999-12-31T23:59:59-01:00 is past year 9999
        raise ValueError(f"invalid date-time {text!r}: {exc}") from exc


def format_deadline(deadline: datetime) -> str:
    """The canonical form this package writes: UTC with milliseconds and ``Z``."""
    return deadline.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _is_unicode(name: str) -> bool:
    """False for a name with lone surrogates (JSON can carry them; UTF-8, Postgres and Kafka cannot)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_record(record: InputRecord) -> DelayedMessage:
    """Validate a record's Chronos headers and split them off; InvalidMessageError says why not."""
    ids: list[bytes | None] = []
    deadlines: list[bytes | None] = []
    relayed: list[Header] = []
    for header in record.headers:  # one pass: this runs for every record
        name = header[0]
        if name == MESSAGE_ID_HEADER:
            ids.append(header[1])
        elif name == DEADLINE_HEADER:
            deadlines.append(header[1])
        else:
            relayed.append(header)
    if not ids:
        raise InvalidMessageError(DropReason.MISSING_MESSAGE_ID.value, f"no {MESSAGE_ID_HEADER} header")
    if len(ids) > 1:
        raise InvalidMessageError(DropReason.DUPLICATE_HEADER.value,
                                  f"{len(ids)} {MESSAGE_ID_HEADER} headers")
    if not deadlines:
        raise InvalidMessageError(DropReason.MISSING_DEADLINE.value, f"no {DEADLINE_HEADER} header")
    if len(deadlines) > 1:
        raise InvalidMessageError(DropReason.DUPLICATE_HEADER.value,
                                  f"{len(deadlines)} {DEADLINE_HEADER} headers")
    raw_id, raw_deadline = ids[0] or b"", deadlines[0] or b""
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
    for name, _ in relayed:
        if "\x00" in name:
            raise InvalidMessageError(DropReason.INVALID_HEADER_NAME.value, f"header {name!r} contains NUL")
        if not name.isascii() and not _is_unicode(name):
            raise InvalidMessageError(DropReason.INVALID_HEADER_NAME.value, f"header {name!r} is not UTF-8")
    return DelayedMessage(message_id, deadline, record.key, record.value, tuple(relayed))


_to_json = json.JSONEncoder(separators=(",", ":")).encode  # one encoder: json.dumps builds one per call


def headers_to_json(headers: Iterable[Header]) -> str:
    """Headers as stored: the seed's ``[{"name": "value"}, ...]``, values base64 (bytes kept exactly)."""
    if not headers:
        return "[]"
    return _to_json([{k: None if v is None else base64.b64encode(v).decode("ascii")} for k, v in headers])


def headers_from_json(stored: list[dict[str, str | None]]) -> tuple[Header, ...]:
    """Inverse of headers_to_json (order and repeated names preserved)."""
    return tuple(
        (k, None if v is None else base64.b64decode(v)) for item in stored for k, v in item.items()
    )
