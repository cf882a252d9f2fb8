"""A scheduled call on the wire: the Kafka record that waits in the delay scheduler, and what the
relay reads back from its output topic. One place builds and reads these headers.

A scheduled call is a record of the delay scheduler's input topic with the Chronos headers
(``chronosMessageId`` = the call's id, ``chronosDeadline``), the call's pool, key and id
(``x-switchyard-pool``, ``x-switchyard-key``, ``x-switchyard-id``), and optionally the durable reply
queue its answer goes to (``x-switchyard-reply-queue``) and the epoch ms at which it expires
(``x-switchyard-deadline-ms``); the record's key is the call's key, its value the body. The
scheduler relays every header but its own two, so the fired record names where the call goes.
Other headers travel on into the AMQP request: the call's own (``ScheduledCall.headers``) and its
W3C ``traceparent`` (the call's, else the request in hand's, else a new trace). The AMQP properties
of that request are built here too (``request_properties``), so the client can refuse a call the
relay could not publish.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pika

from switchyard.core import tracing
from switchyard.core.errors import InvalidNameError
from switchyard.delay.model import (
    DEADLINE_HEADER,
    MAX_MESSAGE_ID_LENGTH,
    MESSAGE_ID_HEADER,
    Header,
    InputRecord,
)
from switchyard.delay.parsing import format_deadline
from switchyard.rpc import frames, protocol
from switchyard.rpc.errors import ScheduledCallError

# The headers the relay reads itself; every other header goes on into the request's AMQP headers.
_CALL_HEADERS = frozenset({protocol.POOL_HEADER, protocol.KEY_HEADER, protocol.ID_HEADER,
                           protocol.REPLY_QUEUE_HEADER, protocol.DEADLINE_HEADER})


@dataclass(frozen=True, slots=True)
class ScheduledCall:
    """A call to make at ``deadline``: what a caller schedules and what the relay publishes.

    ``reply_queue``: the durable reply queue's full name (``protocol.reply_queue``), None: no answer.
    ``expires_ms``: epoch ms after which the call is not made (None: it never expires).
    ``headers``: further headers to carry into the request (strings or bytes).
    """

    id: str
    pool: str
    key: str
    body: bytes
    reply_queue: str | None = None
    expires_ms: int | None = None
    headers: tuple[Header, ...] = ()


def validate_call_id(call_id: str) -> str:
    """A call id the delay scheduler accepts as ``chronosMessageId`` (1-128 characters, no NUL) and
    AMQP carries as message and correlation id (a short string: 255 bytes of UTF-8)."""
    if not isinstance(call_id, str) or not call_id or len(call_id) > MAX_MESSAGE_ID_LENGTH\
            or "\x00" in call_id or frames.utf8_len(call_id) > frames.SHORTSTR_BYTES:
        raise InvalidNameError(f"a call id must be 1-{MAX_MESSAGE_ID_LENGTH} characters and at most 255 "
                               f"bytes of UTF-8, without NUL, got {str(call_id)[:40]!r}")
    return call_id


def validate_expiry(expires_ms: int) -> int:
    """An expiry (epoch ms) the request's ``x-switchyard-deadline-ms`` header can carry (a long-long)."""
    if expires_ms not in frames.LONG_LONG:
        raise InvalidNameError(f"{protocol.DEADLINE_HEADER} {str(expires_ms)[:40]} is past what AMQP carries "
                               "(a 64-bit signed integer of epoch milliseconds)")
    return expires_ms


def as_amqp(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, Any]:
    """Kafka headers as AMQP headers: UTF-8 values as strings (a trace context), others as bytes."""
    table: dict[str, Any] = {}
    for name, value in headers:
        try:
            table[name] = value.decode("utf-8") if value is not None else None
        except UnicodeDecodeError:
            table[name] = value
    return table


def request_properties(call: ScheduledCall, now_ms: int) -> pika.BasicProperties:
    """The AMQP properties of the request ``call`` becomes: its id as message and correlation id."""
    headers = as_amqp(call.headers)
    headers[protocol.KEY_HEADER] = call.key
    if call.expires_ms is not None:
        headers[protocol.DEADLINE_HEADER] = call.expires_ms
    expiration = None if call.expires_ms is None else str(max(1, call.expires_ms - now_ms))
    return pika.BasicProperties(message_id=call.id, correlation_id=call.id, reply_to=call.reply_queue,
                                expiration=expiration, headers=headers,
                                delivery_mode=pika.DeliveryMode.Persistent)


def scheduled_headers(call: ScheduledCall, deadline: datetime) -> list[tuple[str, bytes]]:
    """The Kafka headers of ``call``'s record on the delay scheduler's input topic."""
    headers = [(MESSAGE_ID_HEADER, call.id.encode()), (DEADLINE_HEADER, format_deadline(deadline).encode()),
               (protocol.POOL_HEADER, call.pool.encode()), (protocol.KEY_HEADER, call.key.encode()),
               (protocol.ID_HEADER, call.id.encode())]
    if call.reply_queue is not None:
        headers.append((protocol.REPLY_QUEUE_HEADER, call.reply_queue.encode()))
    if call.expires_ms is not None:
        headers.append((protocol.DEADLINE_HEADER, str(call.expires_ms).encode()))
    headers.extend((name, value) for name, value in call.headers if value is not None)
    if not any(name == tracing.TRACEPARENT_HEADER for name, _ in call.headers):
        # the request in hand's trace, else a new one: relayed with the record into the request
        headers.append((tracing.TRACEPARENT_HEADER, tracing.outgoing_traceparent().encode()))
    return headers


def _text(name: str, value: bytes | None) -> str:
    if value is None:
        raise ScheduledCallError("malformed", f"{name} is null")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScheduledCallError("malformed", f"{name} is not UTF-8") from exc


def fired_pool(record: InputRecord) -> str | None:
    """The pool a fired record names, as sent (None: not a scheduled call; it stays on the topic)."""
    for name, value in record.headers:
        if name == protocol.POOL_HEADER:
            return None if value is None else value.decode("utf-8", "replace")
    return None


def read_fired(record: InputRecord) -> ScheduledCall:
    """The call a fired record carries; ``ScheduledCallError`` (reason ``malformed``) says what is
    wrong with it. Call it on records ``fired_pool`` names a pool for."""
    found: dict[str, bytes | None] = {}
    others: list[Header] = []
    for name, value in record.headers:
        if name in _CALL_HEADERS:
            if name in found:
                raise ScheduledCallError("malformed", f"{name} appears more than once")
            found[name] = value
        else:
            others.append((name, value))
    try:
        pool = protocol.validate_pool(_text(protocol.POOL_HEADER, found.get(protocol.POOL_HEADER)))
        if protocol.KEY_HEADER not in found:
            raise ScheduledCallError("malformed", f"no {protocol.KEY_HEADER} header")
        key = protocol.validate_key(_text(protocol.KEY_HEADER, found[protocol.KEY_HEADER]))
        if protocol.ID_HEADER not in found:
            raise ScheduledCallError("malformed", f"no {protocol.ID_HEADER} header")
        call_id = validate_call_id(_text(protocol.ID_HEADER, found[protocol.ID_HEADER]))
        reply = found.get(protocol.REPLY_QUEUE_HEADER)
        reply_queue = None
        if reply is not None:
            reply_queue = _text(protocol.REPLY_QUEUE_HEADER, reply)
            # only a durable reply queue
            protocol.reply_queue(reply_queue.removeprefix(protocol.REPLY_QUEUE_PREFIX))
            if not reply_queue.startswith(protocol.REPLY_QUEUE_PREFIX):
                raise InvalidNameError(f"reply queue {reply_queue[:80]!r} is not a durable reply queue")
        expires = found.get(protocol.DEADLINE_HEADER)
        expires_ms = None
        if expires is not None:
            text = _text(protocol.DEADLINE_HEADER, expires)
            if not (text.isascii() and text.isdigit()):
                raise ScheduledCallError("malformed", f"{protocol.DEADLINE_HEADER} is not epoch milliseconds")
            expires_ms = validate_expiry(int(text))
    except InvalidNameError as exc:
        raise ScheduledCallError("malformed", str(exc)) from exc
    return ScheduledCall(call_id, pool, key, record.value or b"", reply_queue, expires_ms, tuple(others))
