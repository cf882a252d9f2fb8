"""What one AMQP message can carry, checked before it is published.

pika refuses a short string over 255 bytes (message and correlation ids, reply-to, header names)
and an integer outside a long-long only while it writes the frames, mid-batch; the broker closes
the whole connection (``FRAME_ERROR ... frame_too_large``) on a content header over its frame size.
Either way every message of the batch fails with the one that cannot be carried. ``fault`` says
what is wrong with a message's properties beforehand, so that message fails alone, for its reason.
"""

from __future__ import annotations

from typing import Any

import pika

SHORTSTR_BYTES = 255  # an AMQP short string: ids, reply-to, expiration, header (table) names
LONG_LONG = range(-(2**63), 2**63)  # an integer header value ('l')
# A content header frame's bytes beside the properties: the frame's header and end (8), and the
# content header's class, weight and body size (14). The properties cannot span frames.
FRAME_OVERHEAD = 8 + 14
SHORT_STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
                           "message_id", "type", "user_id", "app_id", "cluster_id")
_SHOWN = 40  # characters of a name shown in a fault


def utf8_len(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def _header_fault(name: Any, value: Any) -> str | None:
    if not isinstance(name, str):
        return f"header name {name!r:.{_SHOWN}} is not a string"
    if utf8_len(name) > SHORTSTR_BYTES:
        return f"header name {name[:_SHOWN]!r}... takes {utf8_len(name)} bytes: AMQP carries 255"
    if isinstance(value, int) and not isinstance(value, bool) and value not in LONG_LONG:
        return f"header {name[:_SHOWN]!r} holds {str(value)[:_SHOWN]}: AMQP carries a 64-bit signed integer"
    return None


def encoded_size(props: pika.BasicProperties) -> int:
    """The bytes ``props`` take in a content header frame; ``ValueError`` (one line) if pika cannot
    encode them (a nested table's long name, a value of no AMQP type)."""
    try:
        return sum(len(piece) for piece in props.encode())
    except Exception as exc:  # pika raises struct.error, its own errors, TypeError...: all this message's
        raise ValueError(f"properties cannot be encoded in AMQP: {type(exc).__name__}: "
                         f"{str(exc)[:80]}") from exc


def fault(props: pika.BasicProperties, frame_max: int) -> str | None:
    """What makes ``props`` impossible to publish (one line), or None: short strings of at most 255
    bytes, long-long integers, and the whole within one frame of ``frame_max`` bytes."""
    for field in SHORT_STRING_PROPERTIES:
        value = getattr(props, field)
        if isinstance(value, str) and utf8_len(value) > SHORTSTR_BYTES:
            return f"{field} takes {utf8_len(value)} bytes: AMQP carries 255"
    for name, value in (props.headers or {}).items():
        if (problem := _header_fault(name, value)) is not None:
            return problem
    try:
        size = encoded_size(props)
    except ValueError as exc:
        return str(exc)
    if size + FRAME_OVERHEAD > frame_max:
        return f"properties and headers take {size} bytes: more than the frame size ({frame_max} bytes)"
    return None
