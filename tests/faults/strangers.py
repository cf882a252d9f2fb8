"""Strangers' messages (issue 34): the shapes other people's clients send, and seeded mutations of them.

Switchyard's own client never sends these; a plain pika client or a plain Kafka producer does, and
the broker accepts them. pika cannot encode some (a ``T`` header of a year past 9999, an array
nested deeper than Python's recursion limit), so AMQP header tables are built here as raw AMQP
0-9-1 field-table bytes (RabbitMQ's field types) and carried by ``RawProperties``, whose ``encode``
splices them into the content header that pika frames as usual.

Each ``Stranger`` names the consumer it is sent at (``target``) and the id it carries in its body
(and, on Kafka, its value), by which the scenario finds what became of it.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika

from switchyard.delay.model import DEADLINE_HEADER, MESSAGE_ID_HEADER
from switchyard.rpc import protocol

# Where a stranger is sent: the request exchange with a warm key (workers), with a new key (the
# orphan bridge), the dead-letter exchange (the dead-letter bridge), the activity exchange, the
# delay scheduler's output topic (the relay) and its input topic (the enqueue handler).
WORKER, ORPHAN, DEAD_LETTER, ACTIVITY, RELAY, ENQUEUE = ("worker", "orphan", "dead-letter", "activity",
                                                         "relay", "enqueue")
AMQP_TARGETS = (WORKER, ORPHAN, DEAD_LETTER, ACTIVITY)
SHED_HEADER = "x-faults-shed"  # tests/faults/handlers.py sheds (Requeue) such a request once
FORGED_USER_ID = "forged-by-a-stranger"  # a producer's own x-switchyard-user-id header
CONNECTION_USER = "{the publishing connection's user}"  # the sender puts its user in ``user_id``


# -- AMQP 0-9-1 field values, as RabbitMQ encodes them ------------------------------------------
def short_string(text: bytes) -> bytes:
    return struct.pack(">B", len(text)) + text


def long_string(value: bytes) -> bytes:
    return b"S" + struct.pack(">I", len(value)) + value


def timestamp(seconds: int) -> bytes:
    """A ``T`` value: AMQP says seconds; a client that sends milliseconds sends a year past 9999."""
    return b"T" + struct.pack(">Q", seconds % 2**64)


def array(*values: bytes) -> bytes:
    inner = b"".join(values)
    return b"A" + struct.pack(">I", len(inner)) + inner


def nested_array(depth: int, leaf: bytes = b"V") -> bytes:
    """An array of an array of ... ``depth`` levels (RabbitMQ takes it; a recursive decoder does not)."""
    value = leaf
    for _ in range(depth):
        value = array(value)
    return value


def table(items: list[tuple[bytes, bytes]]) -> bytes:
    """A field table (the 4-byte length and its name/value pairs); also a header value, after ``F``."""
    inner = b"".join(short_string(name) + value for name, value in items)
    return struct.pack(">I", len(inner)) + inner


def nested_table(depth: int) -> bytes:
    value = b"V"
    for _ in range(depth):
        value = b"F" + table([(b"t", value)])
    return value


def integer(kind: bytes, value: int) -> bytes:
    return kind + struct.pack({b"b": ">b", b"B": ">B", b"s": ">h", b"u": ">H", b"I": ">i", b"i": ">I",
                               b"l": ">q"}[kind], value)


def double(value: float) -> bytes:
    return b"d" + struct.pack(">d", value)


def decimal(scale: int, raw: int) -> bytes:
    return b"D" + struct.pack(">Bi", scale, raw)


class RawProperties(pika.BasicProperties):  # type: ignore[misc]  # pika ships no annotations
    """``BasicProperties`` whose header table is given as raw field-table bytes (``table``)."""

    def __init__(self, raw_headers: bytes, **props: Any) -> None:
        super().__init__(**props)
        self.raw_headers = raw_headers

    def encode(self) -> list[bytes]:
        """pika's encoding with an empty table, whose piece is then replaced by the raw one."""
        assert self.content_type is None and self.content_encoding is None, "not spliced around"
        self.headers = {}
        try:
            pieces: list[bytes] = super().encode()
        finally:
            self.headers = None
        assert pieces[1] == b"\x00\x00\x00\x00"  # [flags, the empty table, ...]
        pieces[1] = self.raw_headers
        return pieces


# -- reading them back: pika cannot decode what it cannot encode -----------------------------------
_SIZES = {b"t": 1, b"b": 1, b"B": 1, b"U": 2, b"u": 2, b"s": 2, b"I": 4, b"i": 4, b"L": 8, b"l": 8, b"f": 4,
          b"d": 8, b"D": 5, b"T": 8, b"V": 0}


def skim_table(raw: bytes) -> dict[str, Any]:
    """A field table's top level, without recursion: long strings decoded, other values skipped
    (their type byte kept); it stops at a type it does not know."""
    found: dict[str, Any] = {}
    at = 0
    while at < len(raw):
        name = raw[at + 1:at + 1 + raw[at]].decode("utf-8", "replace")
        at += 1 + raw[at]
        kind = raw[at:at + 1]
        at += 1
        if kind in _SIZES:
            found[name], at = kind, at + _SIZES[kind]
        elif kind in (b"S", b"x", b"A", b"F"):
            length = struct.unpack_from(">I", raw, at)[0]
            value = raw[at + 4:at + 4 + length]
            found[name] = value.decode("utf-8", "replace") if kind == b"S" else kind
            at += 4 + length
        else:
            break
    return found


class SkimmedProperties(pika.BasicProperties):  # type: ignore[misc]
    """``BasicProperties`` decoded with ``skim_table`` for the headers (the scenario's own reader)."""

    def decode(self, encoded: bytes, offset: int = 0) -> SkimmedProperties:
        flags = struct.unpack_from(">H", encoded, offset)[0]  # one flag word: Basic has 14 flags
        if not flags & self.FLAG_HEADERS:
            super().decode(encoded, offset)
            return self
        at = offset + 2
        for flag in (self.FLAG_CONTENT_TYPE, self.FLAG_CONTENT_ENCODING):
            if flags & flag:
                at += 1 + encoded[at]
        length = struct.unpack_from(">I", encoded, at)[0]
        headers = skim_table(bytes(encoded[at + 4:at + 4 + length]))
        before, after = encoded[offset + 2:at], encoded[at + 4 + length:]
        super().decode(struct.pack(">H", flags & ~self.FLAG_HEADERS) + before + after, 0)
        self.headers = headers
        return self


def read_queue(url: str, queue: str) -> list[tuple[bytes, dict[str, Any]]]:
    """Take every message of ``queue``: (body, skimmed headers). pika builds content headers from
    ``pika.spec.props``: ours stand in for the read, then pika's come back."""
    taken = []
    saved = pika.spec.props[pika.BasicProperties.INDEX]
    pika.spec.props[pika.BasicProperties.INDEX] = SkimmedProperties
    try:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        try:
            channel = connection.channel()
            while True:
                method, props, body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    return taken
                taken.append((body, props.headers or {}))
        finally:
            connection.close()
    finally:
        pika.spec.props[pika.BasicProperties.INDEX] = saved


# -- the strangers --------------------------------------------------------------------------------
@dataclass
class Stranger:
    """One malformed message: AMQP (``headers`` raw field values, ``props``) or Kafka (``kafka``)."""

    id: str
    shape: str
    target: str
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    props: dict[str, Any] = field(default_factory=dict)
    kafka: list[tuple[str, bytes | None]] = field(default_factory=list)
    value: bytes | None = None  # Kafka: the record's value (None: the id)

    def properties(self, user: str) -> RawProperties:
        """``user``: the publishing connection's (the broker checks a ``user_id`` against it)."""
        props = {k: user if v == CONNECTION_USER else v for k, v in self.props.items()}
        return RawProperties(table(self.headers), message_id=self.id, correlation_id=self.id, **props)


def _utf8_mangled(rng: random.Random, text: bytes) -> bytes:
    """``text`` with a byte no UTF-8 string has, somewhere."""
    at = rng.randrange(len(text) + 1)
    return text[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"]) + text[at:]


def _millis_now(rng: random.Random) -> int:
    return int(time.time() * 1000) * rng.choice([1, 1, 1000]) + rng.randrange(1000)


def _odd_value(rng: random.Random) -> bytes:
    """A header value of a type or size Switchyard's headers never have."""
    return rng.choice([
        lambda: timestamp(_millis_now(rng)),
        lambda: nested_array(rng.randrange(1_100, 3_000)),
        lambda: nested_table(rng.randrange(1_100, 2_000)),
        lambda: timestamp(2**64 - 1 - rng.randrange(2**32)),
        lambda: double(rng.choice([1e308, -1e308, 5e-324])),  # RabbitMQ refuses NaN and infinities
        lambda: decimal(rng.randrange(256), rng.randrange(-2**31, 2**31)),
        lambda: long_string(_utf8_mangled(rng, b"key")),
        lambda: long_string(b"x" * rng.randrange(20_000, 60_000)),
        lambda: integer(rng.choice([b"b", b"s", b"I", b"l"]), -1),
        lambda: b"x" + struct.pack(">I", 3) + b"\x00\xff\x00",
        lambda: b"V",
    ])()


# A shape: rng -> (headers, props) of an AMQP stranger. The shapes first, then mutations.
AmqpShape = Callable[[random.Random], tuple[list[tuple[bytes, bytes]], dict[str, Any]]]
UNDECODABLE: dict[str, AmqpShape] = {
    "T header in ms": lambda rng: ([(b"sent-at", timestamp(_millis_now(rng)))], {}),
    "array 1,200 deep": lambda rng: ([(b"path", nested_array(1_200 + rng.randrange(800)))], {}),
    "odd header value": lambda rng: ([(rng.choice([b"x-switchyard-key", b"x-switchyard-deadline-ms",
                                                   b"x-event", b"traceparent", b"x-any"]),
                                       _odd_value(rng))], {}),
    "T header near 2**64": lambda rng: ([(b"expires-at", timestamp(2**64 - 1 - rng.randrange(2**40)))], {}),
}
ODD: dict[str, AmqpShape] = {
    "timestamp property in ms": lambda rng: ([], {"timestamp": _millis_now(rng)}),
    "redeliveries zz, shed": lambda rng: ([(protocol.REDELIVERIES_HEADER.encode(), rng.choice([
        long_string(b"zz"), long_string(b""), long_string(b"1e9"), long_string(b"-1"),
        long_string(_utf8_mangled(rng, b"7")), b"t\x01", double(1.5), b"V"])),
        (SHED_HEADER.encode(), long_string(b"1"))], {}),
    "NUL in x-switchyard-key": lambda rng: ([(protocol.KEY_HEADER.encode(),
                                             long_string(rng.choice([b"a\x00b", b"\x00", b"k\x00\x00",
                                                                     b"stranger\x00-key"])))], {}),
    "forged x-switchyard-user-id": lambda rng: ([(protocol.ORIGINAL_USER_ID_HEADER.encode(),
                                                 long_string(FORGED_USER_ID.encode()))], {}),
    "forged x-switchyard-user-id beside user_id": lambda rng: ([(protocol.ORIGINAL_USER_ID_HEADER.encode(),
                                                                long_string(FORGED_USER_ID.encode()))],
                                                               {"user_id": CONNECTION_USER}),
}


def amqp_strangers(rng: random.Random, count: int, start: int = 0) -> list[Stranger]:
    """``count`` AMQP strangers, each shape at each of the four AMQP consumers in turn, mutated."""
    found = []
    shapes = [*UNDECODABLE.items(), *ODD.items()]
    for n in range(start, start + count):
        target = AMQP_TARGETS[n % len(AMQP_TARGETS)]
        name, shape = shapes[(n // len(AMQP_TARGETS)) % len(shapes)]
        if name in ODD and target in (DEAD_LETTER, ACTIVITY) and name != "timestamp property in ms":
            name, shape = "T header in ms", UNDECODABLE["T header in ms"]  # only the request paths read these
        headers, props = shape(rng)
        if rng.random() < 0.5:  # a mutation: one more odd header beside the shape
            extra = rng.choice([b"x-extra", _utf8_mangled(rng, b"x-name"), b"x" * 255])
            headers.append((extra, _odd_value(rng)))
        if target == DEAD_LETTER:  # as the broker writes it: the dead-letter path poisons these
            reason = long_string(protocol.Status.DELIVERY_LIMIT.encode())
            headers.append((protocol.FIRST_DEATH_REASON_HEADER.encode(), reason))
        if target == ACTIVITY:
            headers.append((protocol.EVENT_HEADER.encode(),
                            long_string(protocol.Event.REQUEST_RECEIVED.encode())))
        rng.shuffle(headers)
        found.append(Stranger(f"x{n}", name, target, headers, props))
    return found


# -- Kafka strangers: the relay's (fired records) and the enqueue handler's (input records) --------
KafkaHeaders = list[tuple[str, bytes | None]]


def _big_id(rng: random.Random) -> str:
    return rng.choice(["\U0001f600", "\u00e9\u00e9", "\x1b[2J", "\u200b"]) * rng.randrange(100, 128) if\
        rng.random() < 0.5 else "\U0001f600" * 100


def relay_headers(rng: random.Random, pool: str, sid: str, shape: str) -> KafkaHeaders:
    """The headers of a fired call for ``pool`` that AMQP cannot carry, as ``shape`` says."""
    call_id, extra = sid, list[tuple[str, bytes | None]]()
    if shape == "call id of 400 bytes":
        call_id = _big_id(rng)
    elif shape == "header name over 255 bytes":
        extra = [("x-" + "n" * rng.randrange(254, 700), b"v")]
    elif shape == "header value of 200 KB":
        extra = [("x-big", b"v" * rng.randrange(140_000, 260_000))]
    else:
        deadline = rng.choice([2**63, 2**63 + rng.randrange(2**40), 2**64, 10**30, -(2**63) - 1])
        extra = [(protocol.DEADLINE_HEADER, str(deadline).encode())]
    return [(protocol.POOL_HEADER, pool.encode()),
            (protocol.KEY_HEADER, f"relay-{rng.randrange(2)}".encode()),
            (protocol.ID_HEADER, call_id.encode()), *extra]


RELAY_SHAPES = ("call id of 400 bytes", "header name over 255 bytes", "header value of 200 KB",
                "deadline-ms >= 2**63")


def enqueue_headers(rng: random.Random, sid: str, deadline: str) -> tuple[str, KafkaHeaders]:
    """A shape of Chronos headers with wrong types or units, and its name."""
    good_id, good_deadline = (MESSAGE_ID_HEADER, sid.encode()), (DEADLINE_HEADER, deadline.encode())
    shapes: dict[str, KafkaHeaders] = {
        "deadline in epoch ms": [good_id, (DEADLINE_HEADER, str(int(time.time() * 1000) + 1000).encode())],
        "deadline as 8 bytes": [good_id, (DEADLINE_HEADER, struct.pack(">q", int(time.time() * 1000)))],
        "deadline past 9999": [good_id, (DEADLINE_HEADER, b"9999-12-31T23:59:59-23:59")],
        "deadline not UTF-8": [good_id, (DEADLINE_HEADER, _utf8_mangled(rng, deadline.encode()))],
        "no message id": [good_deadline],
        "message id of 10 KB": [(MESSAGE_ID_HEADER, sid.encode() + b"i" * 10_000), good_deadline],
        "message id with NUL": [(MESSAGE_ID_HEADER, sid.encode() + b"\x00"), good_deadline],
        "message id not UTF-8": [(MESSAGE_ID_HEADER, _utf8_mangled(rng, sid.encode())), good_deadline],
        "null Chronos headers": [(MESSAGE_ID_HEADER, None), (DEADLINE_HEADER, None)],
        "Chronos headers twice": [good_id, good_deadline, (MESSAGE_ID_HEADER, b"other-" + sid.encode()),
                                  (DEADLINE_HEADER, b"2001-01-01T00:00:00Z")],
    }
    name = rng.choice(sorted(shapes))
    return name, shapes[name]


def kafka_strangers(rng: random.Random, pool: str, count: int, deadline: Callable[[], str],
                    start: int = 0) -> list[Stranger]:
    """Half at the relay (its output topic, or through the input topic with good Chronos headers),
    half at the enqueue handler (wrong Chronos headers, a huge or missing value)."""
    found = []
    for n in range(start, start + count):
        sid = f"k{n}"
        if n % 2:
            shape = RELAY_SHAPES[(n // 4) % len(RELAY_SHAPES)]  # each shape straight and via the input
            headers = relay_headers(rng, pool, sid, shape)
            if n % 4 == 3:  # through the scheduler: it relays every header but its own two
                chronos = [(MESSAGE_ID_HEADER, sid.encode()), (DEADLINE_HEADER, deadline().encode())]
                headers = [*chronos, *headers]
                found.append(Stranger(sid, f"{shape}, via the input topic", ENQUEUE, kafka=headers))
            else:
                found.append(Stranger(sid, shape, RELAY, kafka=headers))
        else:
            shape, headers = enqueue_headers(rng, sid, deadline())
            value = rng.choice([None, b"", b"\xff" * 500_000]) if rng.random() < 0.3 else None
            found.append(Stranger(sid, shape, ENQUEUE, kafka=[*headers, ("test-id", sid.encode())],
                                  value=value))
    return found
