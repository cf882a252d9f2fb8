"""A content header decoder that one message's headers can never turn into a lost connection.

pika decodes a delivery's properties inside the connection's I/O (``pika.frame.decode_frame`` ->
``spec.props[60]().decode``): an exception there loses the connection. RabbitMQ delivers header
tables that pika's ``decode_table`` cannot read: a ``T`` (timestamp) in milliseconds (a year past
9999: ``ValueError``), an array nested 1,200 deep (``RecursionError``). A worker died on each
delivery of such a request (a delivery-limit strike for every request it had prefetched), and a
bridge reconnected for ever on the same dead letter.

``TolerantProperties`` replaces pika's ``BasicProperties`` in ``pika.spec.props`` (``install``,
called by ``amqp.connect``): the table is decoded here, as pika would, except that a timestamp
outside Python's dates stays a number (seconds) and floats stay floats; one that still cannot
be read (nested deeper than ``MAX_HEADER_DEPTH``, a type RabbitMQ would not send) is skipped by its
length prefix, the other properties are decoded by pika as usual, and the headers become
``{UNDECODABLE_HEADER: reason}``: every consumer poisons such a message (``undecodable``). A
short-string property that is not UTF-8 is dropped and marked the same way.
pika is pinned exactly (constraints.txt); tests/rpc/test_undecodable_headers.py sends the raw shapes
through the broker, so a change of pika's internals fails there.
"""

from __future__ import annotations

import decimal
import struct
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import pika.spec

from switchyard.core.errors import RpcError
from switchyard.rpc import protocol
from switchyard.rpc.frames import SHORT_STRING_PROPERTIES

_FLAGS_BEFORE_HEADERS = (pika.spec.BasicProperties.FLAG_CONTENT_TYPE,
                         pika.spec.BasicProperties.FLAG_CONTENT_ENCODING)
# Fixed-size field values: type octet -> struct format (as pika.data.decode_value reads them).
_FIXED = {b"t": ">B", b"b": ">b", b"B": ">B", b"U": ">h", b"u": ">H", b"s": ">h", b"I": ">i", b"i": ">I",
          b"L": ">q", b"l": ">q", b"f": ">f", b"d": ">d", b"T": ">Q"}
_SIZES = {kind: struct.calcsize(fmt) for kind, fmt in _FIXED.items()}


class HeaderDecodeError(RpcError, ValueError):
    """A header table Switchyard will not decode (the reason is the message)."""


def _timestamp(seconds: int) -> datetime | int:
    """pika's datetime where Python has one; the number of seconds itself beyond (year > 9999)."""
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (ValueError, OverflowError, OSError):
        return seconds


def _long_string(raw: bytes) -> str | bytes:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


_CONVERT: dict[bytes, Callable[[Any], Any]] = {b"t": bool, b"T": _timestamp}


def decode_value(encoded: bytes, offset: int, depth: int) -> tuple[Any, int]:
    kind = encoded[offset:offset + 1]
    offset += 1
    if kind in _FIXED:
        value = struct.unpack_from(_FIXED[kind], encoded, offset)[0]
        return _CONVERT.get(kind, _same)(value), offset + _SIZES[kind]
    if kind in (b"S", b"x"):
        length = struct.unpack_from(">I", encoded, offset)[0]
        raw = bytes(encoded[offset + 4:offset + 4 + length])
        return (_long_string(raw) if kind == b"S" else raw), offset + 4 + length
    if kind == b"D":
        decimals, raw_int = struct.unpack_from(">Bi", encoded, offset)
        return decimal.Decimal(raw_int) * (decimal.Decimal(10) ** -decimals), offset + 5
    if kind == b"V":
        return None, offset
    if kind in (b"A", b"F"):
        if depth >= protocol.MAX_HEADER_DEPTH:
            raise HeaderDecodeError(f"tables and arrays nested deeper than {protocol.MAX_HEADER_DEPTH}")
        if kind == b"F":
            return decode_table(encoded, offset, depth + 1)
        length = struct.unpack_from(">I", encoded, offset)[0]
        offset += 4
        end, items = offset + length, []
        while offset < end:
            item, offset = decode_value(encoded, offset, depth + 1)
            items.append(item)
        return items, offset
    raise HeaderDecodeError(f"unknown field type {kind!r}")


def _same(value: Any) -> Any:
    return value


def decode_table(encoded: bytes, offset: int, depth: int = 0) -> tuple[dict[str | bytes, Any], int]:
    """An AMQP field table as pika decodes it (see the module docstring for the differences)."""
    size = struct.unpack_from(">I", encoded, offset)[0]
    offset += 4
    end, table = offset + size, dict[str | bytes, Any]()
    if end > len(encoded):
        raise HeaderDecodeError(f"a table of {size} bytes in {len(encoded) - offset}")
    while offset < end:
        length = encoded[offset]
        key = _long_string(bytes(encoded[offset + 1:offset + 1 + length]))
        value, offset = decode_value(encoded, offset + 1 + length, depth)
        table[key] = value  # a non-UTF-8 name stays bytes, as in pika
    return table, offset


_INT32, _INT64, _UINT64 = 2**31, 2**63, 2**64


def encode_value(value: Any, depth: int = 0) -> bytes:
    """A header value as the field-table bytes that carry it back to the broker. Everything this
    module decodes is carried again: where pika's encoder raises (a float, a timestamp past 2**63
    kept as seconds: a shed copy of such a request killed its worker), this writes ``d`` and ``T``;
    an integer no AMQP type holds, or a value of another type, is written as its text."""
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return b"S" + struct.pack(">I", len(raw)) + raw
    if isinstance(value, bytes | bytearray | memoryview):
        return b"x" + struct.pack(">I", len(value)) + bytes(value)
    if isinstance(value, bool):
        return b"t" + struct.pack(">B", value)
    if isinstance(value, int):
        if -_INT32 <= value < _INT32:
            return b"I" + struct.pack(">i", value)
        if -_INT64 <= value < _INT64:
            return b"l" + struct.pack(">q", value)
        if 0 <= value < _UINT64:  # only a timestamp decodes this large (``_timestamp``)
            return b"T" + struct.pack(">Q", value)
        return encode_value(str(value))
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        if isinstance(exponent, int) and 0 <= -exponent < 256 and -_INT32 <= unscaled < _INT32:
            return b"D" + struct.pack(">Bi", -exponent, unscaled)
        return encode_value(str(value))
    if isinstance(value, datetime):
        return b"T" + struct.pack(">Q", int(value.timestamp()))
    if value is None:
        return b"V"
    if depth < protocol.MAX_HEADER_DEPTH and isinstance(value, Mapping):
        return b"F" + encode_table(value, depth + 1)
    if depth < protocol.MAX_HEADER_DEPTH and isinstance(value, list | tuple):
        items = b"".join(encode_value(item, depth + 1) for item in value)
        return b"A" + struct.pack(">I", len(items)) + items
    if isinstance(value, Mapping | list | tuple):
        return encode_value(f"nested deeper than {protocol.MAX_HEADER_DEPTH}")
    return encode_value(repr(value))


def encode_table(table: Mapping[Any, Any], depth: int = 0) -> bytes:
    """A field table's bytes (``encode_value``'s rules); a name over 255 bytes is cut to 255."""
    entries = []
    for key, value in table.items():
        name = (key if isinstance(key, bytes) else str(key).encode("utf-8"))[:255]
        entries.append(struct.pack(">B", len(name)) + name + encode_value(value, depth))
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


class TolerantProperties(pika.spec.BasicProperties):
    """``BasicProperties`` whose ``decode`` never raises for the headers table (module docstring),
    and whose ``encode`` carries every header value it decoded (``encode_value``): the copies a
    worker or handler republishes (shed, poison, forwarded) are made of this class."""

    def encode(self) -> list[bytes]:
        headers: dict[Any, Any] | None = vars(self)["headers"]  # pika leaves the attribute untyped
        if headers is None:
            return super().encode()
        self.headers = None
        try:
            pieces = super().encode()
        finally:
            self.headers = headers
        flags = struct.unpack(">H", pieces[0])[0] | self.FLAG_HEADERS
        # pika writes the flags, then two pieces per short string before the table's place
        before = 1 + 2 * sum(getattr(self, name) is not None for name in ("content_type", "content_encoding"))
        return [struct.pack(">H", flags), *pieces[1:before], encode_table(headers), *pieces[before:]]

    def decode(self, encoded: bytes, offset: int = 0) -> TolerantProperties:
        flags = struct.unpack_from(">H", encoded, offset)[0]
        if not flags & self.FLAG_HEADERS or flags & 1:  # no table, or flag words pika alone knows
            super().decode(encoded, offset)
            return self._checked(self.headers)
        start = offset + 2
        for flag in _FLAGS_BEFORE_HEADERS:
            if flags & flag:
                start += 1 + encoded[start]
        headers: dict[str | bytes, Any]
        try:
            headers, end = decode_table(encoded, start)
        except (HeaderDecodeError, struct.error, IndexError, RecursionError) as exc:
            end = start + 4 + struct.unpack_from(">I", encoded, start)[0]
            headers = {protocol.UNDECODABLE_HEADER: f"headers not decodable: {exc}"}
        rest = struct.pack(">H", flags & ~self.FLAG_HEADERS) + encoded[offset + 2:start] + encoded[end:]
        super().decode(rest)
        return self._checked(headers)

    def _checked(self, headers: dict[str | bytes, Any] | None) -> TolerantProperties:
        """Set ``headers``; a short-string property that is not UTF-8 (pika leaves it bytes, which
        the code reading it as text cannot use: ``reply_to.startswith``) is dropped and marked."""
        for name in SHORT_STRING_PROPERTIES:
            if isinstance(getattr(self, name), bytes):
                setattr(self, name, None)
                headers = {**(headers or {}), protocol.UNDECODABLE_HEADER: f"property {name} is not UTF-8"}
        self.headers = headers
        return self


def install() -> None:
    """Make pika decode every content header with ``TolerantProperties`` (idempotent)."""
    pika.spec.props[pika.spec.BasicProperties.INDEX] = TolerantProperties


def undecodable(headers: Mapping[str, Any] | None) -> str | None:
    """Why a message's headers could not be decoded (None: they were). A producer setting the header
    itself only gets its own message poisoned."""
    reason = (headers or {}).get(protocol.UNDECODABLE_HEADER)
    return reason if isinstance(reason, str) and reason else None
