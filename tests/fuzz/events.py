"""Generated ``aws:rmq`` and ``aws:kafka`` events: valid messages mixed with broken ones.

Every generated message says what it is meant to be (``Case``), so a test can check that the good
ones were processed and that each broken one was counted. A broken field is one that the event
parser must refuse (bad base64, a property of the wrong type or out of range, an unreadable
timestamp, headers that are not a table, a record field missing or of the wrong type, a header
byte out of range, a deadline that is not a date or out of range). Odd but legal values (Java
signed bytes, null header values, nested tables, large integers, non-ASCII) are not broken: they
must go through intact.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from switchyard.delay.model import DEADLINE_HEADER, MESSAGE_ID_HEADER
from switchyard.rpc import protocol


def java_bytes(data: bytes) -> list[int]:
    """Bytes as an AWS event carries them: Java's signed bytes (0x80-0xFF are negative)."""
    return [b - 256 if b > 127 else b for b in data]


def rmq_str(text: str) -> dict[str, list[int]]:
    return {"bytes": java_bytes(text.encode("utf-8"))}


# -- odd but legal AMQP header values (they must survive) ---------------------------------------
legal_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=30).map(rmq_str),
    st.binary(max_size=30).map(lambda b: {"bytes": java_bytes(b)}),  # binary, often not UTF-8
    st.sampled_from([rmq_str("é" * 200), {"bytes": java_bytes(bytes(range(256)))}, rmq_str("")]),
)
legal_header_values = st.recursive(
    legal_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("abcxyz-", min_size=1, max_size=8),
                                                                 inner, max_size=3),
    max_leaves=6,
)
header_names = st.text(min_size=1, max_size=20).filter(
    lambda n: not n.startswith("x-") and "\x00" not in n and n not in (MESSAGE_ID_HEADER, DEADLINE_HEADER))

# -- fields the parser must refuse (each yields a counted problem) ------------------------------
BAD_PROPERTIES: list[tuple[str, Any]] = [
    ("deliveryMode", 7), ("deliveryMode", "2"), ("deliveryMode", True), ("priority", 256),
    ("priority", -1), ("priority", "high"), ("expiration", "abc"), ("expiration", "-5"), ("expiration", 5),
    ("expiration", "1.5"),
    ("correlationId", 12345), ("correlationId", "c" * 300), ("correlationId", ["a"]), ("replyTo", 3),
    ("timestamp", "yesterday"), ("timestamp", "Feb 30, 2020, 1:00:00 AM"), ("timestamp", 12),
    ("userId", {"bytes": [1]}), ("appId", "é" * 200), ("messageId", 1.5),
]
BAD_BODIES: list[Any] = ["!!not base64!!", "QQ", 5, ["QQ=="], {"b": 1}]
BAD_HEADER_TABLES: list[Any] = ["headers", ["a", 1], 7]
UNENCODABLE_HEADERS: list[tuple[str, Any]] = [("n" * 300, 1), ("big", 2**70), ("bigger", -(2**80))]


@dataclass
class Case:
    """One generated message and what it is: good (must be processed) or broken (must be counted)."""

    message: Any
    good: bool
    ident: str = ""
    key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@st.composite
def rmq_message(draw: st.DrawFn, *, reply_to: str, keys: list[str], dead_letter: bool = False,
                activity: bool = False) -> Case:
    """A request (orphan), a dead letter or an activity report, good or with broken fields."""
    ident = uuid.uuid4().hex
    key = draw(st.sampled_from(keys))
    headers: dict[str, Any] = {protocol.KEY_HEADER: rmq_str(key)}
    if dead_letter:
        headers[protocol.FIRST_DEATH_REASON_HEADER] = rmq_str(draw(st.sampled_from(
            [protocol.Status.EXPIRED, protocol.Status.REJECTED, protocol.Status.MAXLEN,
             protocol.Status.DELIVERY_LIMIT])))
    if activity:
        headers[protocol.EVENT_HEADER] = rmq_str(draw(st.sampled_from(list(protocol.Event))))
        headers[protocol.WORKER_ID_HEADER] = rmq_str("w-" + ident[:8])
    headers.update(draw(st.dictionaries(header_names, legal_header_values, max_size=4)))
    props: dict[str, Any] = {"correlationId": ident, "replyTo": reply_to, "deliveryMode": 2,
                             "contentType": "application/octet-stream", "headers": headers,
                             "timestamp": "Jan 1, 1970, 12:33:41 AM"}
    body = draw(st.binary(max_size=64))
    message: dict[str, Any] = {"basicProperties": props, "redelivered": draw(st.booleans()),
                               "data": base64.b64encode(body).decode()}
    breakage = draw(st.sampled_from(["none", "none", "property", "body", "headers", "unencodable",
                                     "not-an-object", "no-properties"]))
    if breakage == "property":
        name, value = draw(st.sampled_from(BAD_PROPERTIES))
        props[name] = value
    elif breakage == "body":
        message["data"] = draw(st.sampled_from(BAD_BODIES))
    elif breakage == "headers":
        props["headers"] = draw(st.sampled_from(BAD_HEADER_TABLES))
    elif breakage == "unencodable":
        name, value = draw(st.sampled_from(UNENCODABLE_HEADERS))
        headers[name] = value
    elif breakage == "not-an-object":
        message = draw(st.sampled_from([None, "message", 42, ["data"]]))
    elif breakage == "no-properties":
        message["basicProperties"] = draw(st.sampled_from([None, "props", [1]]))
    # The key survives only where the headers table does.
    kept_key = key if breakage not in ("headers", "not-an-object", "no-properties") else None
    return Case(message, breakage == "none", ident, kept_key, {"body": body, "breakage": breakage})


def rmq_event(cases: list[Case], queue: str) -> dict[str, Any]:
    return {"eventSource": "aws:rmq", "eventSourceArn": "arn:aws:mq:local:000000000000:broker:fuzz:b-1",
            "rmqMessagesByQueue": {f"{queue}::/": [c.message for c in cases]}}


# -- Kafka ----------------------------------------------------------------------------------------
BAD_DEADLINES = ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", "tomorrow", "2026-13-01T00:00:00Z",
                 "2026-02-30T10:00:00Z", "", "1700000000", "2026-01-01T25:00:00Z"]


@st.composite
def kafka_record(draw: st.DrawFn, *, topic: str, offset: int, prefix: str) -> Case:
    """One MSK record: a good Chronos message (future deadline) or one with broken fields."""
    ident = f"{prefix}-{offset}-" + draw(st.text(min_size=1, max_size=12).filter(lambda s: "\x00" not in s))
    deadline = datetime.now(UTC) + timedelta(seconds=draw(st.integers(600, 10**6)))
    text = deadline.isoformat(timespec=draw(st.sampled_from(["seconds", "milliseconds", "microseconds"])))
    headers: list[tuple[str, bytes | None]] = [(MESSAGE_ID_HEADER, ident.encode()),
                                               (DEADLINE_HEADER, text.encode())]
    headers += draw(st.lists(st.tuples(header_names, st.none() | st.binary(max_size=40)), max_size=4))
    record: dict[str, Any] = {
        "topic": topic, "partition": 0, "offset": offset, "timestamp": 1_700_000_000_000,
        "timestampType": "CREATE_TIME",
        "key": base64.b64encode(draw(st.binary(max_size=20))).decode(),
        "value": base64.b64encode(draw(st.binary(max_size=80))).decode(),
        "headers": [{n: None if v is None else java_bytes(v)} for n, v in headers],
    }
    if draw(st.booleans()):
        record.pop("key")  # a null key is legal
    breakage = draw(st.sampled_from(["none", "none", "none", "deadline", "no-id", "value", "header-byte",
                                     "header-type", "offset", "topic", "not-an-object"]))
    if breakage == "deadline":
        record["headers"][1] = {DEADLINE_HEADER: java_bytes(draw(st.sampled_from(BAD_DEADLINES)).encode())}
    elif breakage == "no-id":
        record["headers"].pop(0)
    elif breakage == "value":
        record["value"] = draw(st.sampled_from(["QQ", "Q", 5, ["QQ=="]]))
    elif breakage == "header-byte":
        record["headers"].append({"trace": [1, draw(st.sampled_from([256, -129, 1000]))]})
    elif breakage == "header-type":
        record["headers"].append({"trace": draw(st.sampled_from(["abc", 5, {"a": 1}]))})
    elif breakage == "offset":
        record["offset"] = draw(st.sampled_from(["7", None, 1.5]))
    elif breakage == "topic":
        record.pop("topic")
    elif breakage == "not-an-object":
        record = draw(st.sampled_from([None, "record", 7, ["topic"]]))  # type: ignore[assignment]
    return Case(record, breakage == "none", ident, extra={"breakage": breakage, "headers": headers})


def kafka_event(cases: list[Case], topic: str) -> dict[str, Any]:
    return {"eventSource": "aws:kafka", "eventSourceArn": "arn:aws:kafka:local:000000000000:cluster/fuzz/x",
            "bootstrapServers": "127.0.0.1:9092", "records": {f"{topic}-0": [c.message for c in cases]}}


@st.composite
def kafka_batch(draw: st.DrawFn, *, topic: str, max_size: int = 8) -> list[Case]:
    prefix = uuid.uuid4().hex[:8]
    n = draw(st.integers(1, max_size))
    return [draw(kafka_record(topic=topic, offset=i, prefix=prefix)) for i in range(n)]


odd_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def scheduled_event(draw: st.DrawFn) -> dict[str, Any]:
    """An EventBridge scheduled event, sometimes with odd or missing fields."""
    event: dict[str, Any] = {
        "version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event", "source": "aws.events",
        "account": "000000000000", "time": "2026-11-23T12:00:00Z", "region": "local",
        "resources": ["arn:aws:events:local:000000000000:rule/fuzz"], "detail": {},
    }
    for name in draw(st.lists(st.sampled_from(sorted(event)), max_size=3, unique=True)):
        if draw(st.booleans()):
            event.pop(name)
        else:
            event[name] = draw(odd_json)
    return event
