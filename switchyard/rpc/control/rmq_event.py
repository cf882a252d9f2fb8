"""Amazon MQ (RabbitMQ) Lambda events back into AMQP messages.

The event gives each message's ``basicProperties`` with string header values as
``{"bytes": [...]}`` and the timestamp as text (``"Jan 1, 1970, 12:33:41 AM"``, UTC), the body as
base64, and no routing key or exchange. Converting never raises: a field that cannot be read is
left out and named in ``problems`` so handlers can count it, and nothing else is lost.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pika
import pika.data
from aws_lambda_powertools.utilities.data_classes.common import DictWrapper

from switchyard.core.errors import MalformedEventError
from switchyard.rpc import protocol
from switchyard.rpc.amqp_decode import undecodable

_TIMESTAMP_FORMAT = "%b %d, %Y, %I:%M:%S %p"
_SPACES = re.compile(r"\s+")
_YEAR = re.compile(r"^(.*?, )(-?\d+)(, .*)$")
# 400 Gregorian years repeat the calendar exactly: a timestamp past Python's year 9999 (one in
# milliseconds, from a stranger's client) is shifted by whole cycles, read, and shifted back.
CALENDAR_CYCLE_S = 146_097 * 86_400

_PROPERTY_FIELDS = {
    "contentType": "content_type",
    "contentEncoding": "content_encoding",
    "deliveryMode": "delivery_mode",
    "priority": "priority",
    "correlationId": "correlation_id",
    "replyTo": "reply_to",
    "expiration": "expiration",
    "messageId": "message_id",
    "type": "type",
    "userId": "user_id",
    "appId": "app_id",
    "clusterId": "cluster_id",
}


@dataclass(frozen=True)
class AmqpMessage:
    """One message as it was published: body, properties (headers decoded), redelivery flag."""

    body: bytes
    properties: pika.BasicProperties
    redelivered: bool = False
    queue: str = ""
    problems: tuple[str, ...] = field(default=())

    @property
    def headers(self) -> dict[str, Any]:
        return self.properties.headers or {}

    @property
    def undecodable(self) -> str | None:
        """Why its headers could not be decoded (``amqp_decode``): it goes to the poison inventory."""
        return undecodable(self.headers)

    def header_str(self, name: str) -> str | None:
        value = self.headers.get(name)
        return value if isinstance(value, str) else None

    @property
    def key(self) -> str | None:
        """The worker key: ``x-switchyard-key`` if set, else the routing key that dead-lettering
        recorded in ``x-death`` (the keyed RPC design's clients and workers send no header). None if neither
        carries a usable key."""
        header = self.header_str(protocol.KEY_HEADER)
        if header is not None:
            return header
        routing = death_routing_key(self.headers)
        return protocol.key_from_routing_key(routing) if routing is not None else None

    def death(self, queue_suffix: str = "") -> dict[str, Any] | None:
        """The newest ``x-death`` entry (of a queue ending in ``queue_suffix``), if any."""
        return _death_entry(self.headers, queue_suffix)


def _death_entry(headers: Mapping[str, Any], queue_suffix: str = "") -> dict[str, Any] | None:
    deaths = headers.get(protocol.DEATH_HEADER)
    if not isinstance(deaths, list):
        return None
    for entry in deaths:  # RabbitMQ keeps the newest death first
        if isinstance(entry, dict):
            queue = entry.get("queue")
            if not queue_suffix or (isinstance(queue, str) and queue.endswith(queue_suffix)):
                return entry
    return None


def death_routing_key(headers: Mapping[str, Any]) -> str | None:
    """The original routing key of the newest death: the staging hop's for orphans and reports."""
    entry = _death_entry(headers, protocol.STAGING_SUFFIX) or _death_entry(headers)
    keys = entry.get("routing-keys") if entry else None
    if isinstance(keys, list) and keys and isinstance(keys[0], str):
        return keys[0]
    return None


def timestamp_seconds(value: Any) -> float | None:
    """An AMQP timestamp as decoded here (pika: datetime; Lambda: text; or a number) -> POSIX s."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return moment.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        parsed = parse_timestamp(value)
        return float(parsed) if parsed is not None else None
    return None


def decode_header_value(value: Any) -> Any:
    """``{"bytes": [...]}`` -> str (or bytes when not UTF-8); tables and arrays recursively."""
    if isinstance(value, dict):
        raw = value.get("bytes")
        if len(value) == 1 and isinstance(raw, list) and all(isinstance(b, int) for b in raw):
            data = bytes(b & 0xFF for b in raw)
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                return data
        return {str(k): decode_header_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_header_value(v) for v in value]
    return value


def _encodable(value: Any) -> bool:
    """Whether pika can put ``value`` in an AMQP field table (so the message can be re-published)."""
    try:
        pika.data.encode_table([], {"v": value})
    except Exception:
        return False
    return True


def _short_string(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return len(value.encode("utf-8")) <= protocol.MAX_NAME_BYTES
    except UnicodeEncodeError:
        return False


def _valid_property(name: str, value: Any) -> bool:
    """A property RabbitMQ could have delivered; anything else would make re-publishing fail."""
    if name == "delivery_mode":
        return isinstance(value, int) and not isinstance(value, bool) and value in (1, 2)
    if name == "priority":
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255
    if name == "expiration":  # RabbitMQ closes the channel on anything but a non-negative integer
        return _short_string(value) and value.isascii() and value.isdigit()
    return _short_string(value)


def decode_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """All of a message's ``basicProperties.headers`` decoded (empty when there are none)."""
    return {str(k): decode_header_value(v) for k, v in (headers or {}).items()}


def parse_timestamp(text: str) -> int | None:
    """The event's timestamp text (UTC) -> POSIX seconds, or None if unreadable. Any year is read
    (``CALENDAR_CYCLE_S``)."""
    match = _YEAR.match(_SPACES.sub(" ", text.strip())) if isinstance(text, str) else None
    if match is None:
        return None
    cycles, year = divmod(int(match[2]) - 1970, 400)
    try:
        parsed = datetime.strptime(f"{match[1]}{1970 + year}{match[3]}", _TIMESTAMP_FORMAT)
    except ValueError:
        return None
    return calendar.timegm(parsed.timetuple()) + cycles * CALENDAR_CYCLE_S


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest deeper than ``limit`` in ``value`` (read level by level: the
    Java client decodes any depth, and decoding one 500 deep recursively raised RecursionError)."""
    level = [value]
    for _ in range(limit + 1):
        level = [child for item in level if isinstance(item, dict | list)
                 for child in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return False
    return True


def to_amqp_message(queue: str, message: dict[str, Any]) -> AmqpMessage:
    problems: list[str] = []
    try:
        body = base64.b64decode(message.get("data") or "", validate=True)
    except (binascii.Error, ValueError, TypeError):
        problems.append("data is not base64")
        body = str(message.get("data")).encode()
    props = message.get("basicProperties")
    if not isinstance(props, dict):
        problems.append("basicProperties missing")
        props = {}
    kwargs: dict[str, Any] = {}
    for aws_name, pika_name in _PROPERTY_FIELDS.items():
        value = props.get(aws_name)
        if value is None:
            continue
        if _valid_property(pika_name, value):
            kwargs[pika_name] = value
        else:
            problems.append(f"{aws_name} is not a valid AMQP value: dropped")
    headers = props.get("headers")
    if (isinstance(headers, dict)
            and _nested_deeper(headers, protocol.MAX_HEADER_DEPTH + 2)):  # + {"bytes": [...]}
        problems.append(reason := f"headers not decodable: nested deeper than {protocol.MAX_HEADER_DEPTH}")
        headers = {protocol.UNDECODABLE_HEADER: reason}  # poisoned by the handlers, as amqp_decode's mark
    if isinstance(headers, dict):
        kwargs["headers"] = {}
        for name, raw_value in headers.items():
            value = decode_header_value(raw_value)
            if _short_string(name) and _encodable(value):
                kwargs["headers"][name] = value
            else:
                problems.append(f"header {str(name)[:64]!r} cannot be carried over AMQP: dropped")
    elif headers is not None:
        problems.append("headers is not a table")
    if props.get("timestamp") is not None:
        stamp = parse_timestamp(str(props["timestamp"]))
        if stamp is None:
            problems.append(f"unreadable timestamp {props['timestamp']!r}")
        else:
            kwargs["timestamp"] = stamp
    return AmqpMessage(body, pika.BasicProperties(**kwargs), bool(message.get("redelivered")), queue,
                       tuple(problems))


class RmqEvent(DictWrapper):
    """An ``aws:rmq`` event, the data class of the handlers that read one: its messages are read one
    at a time by ``messages_from_event``. Powertools' ``RabbitMQEvent`` parses every message when it
    is made, so one malformed entry failed the invocation before a handler saw the event."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        _ = self["rmqMessagesByQueue"]  # missing: KeyError from the wrapper (the CLI names the field)


def messages_from_event(event: DictWrapper | dict[str, Any]) -> Iterator[AmqpMessage]:
    """Every message of an ``aws:rmq`` event, in order, queue name without ``::vhost``.

    An event that is not an object of queues raises ``MalformedEventError`` (nothing in it can be
    read); a queue entry that is not a list of messages reads as one malformed message (the
    handlers count and drop it), and the other entries go on.
    """
    raw = event.raw_event if isinstance(event, DictWrapper) else event
    by_queue = raw.get("rmqMessagesByQueue") if isinstance(raw, dict) else raw
    if not isinstance(by_queue, dict):
        raise MalformedEventError(
            "not an aws:rmq event: expected an object whose rmqMessagesByQueue maps '<queue>::<vhost>' "
            f"to a list of messages, got {type(by_queue).__name__}")
    for queue_vhost, messages in by_queue.items():
        queue = str(queue_vhost).rsplit("::", 1)[0]
        if not isinstance(messages, list | None):
            messages = [None]  # one malformed message: counted and dropped like any other
        for message in messages or []:
            yield to_amqp_message(queue, message if isinstance(message, dict) else {})
