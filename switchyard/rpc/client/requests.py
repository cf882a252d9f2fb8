"""A request, validated and encoded in the caller's thread, so a bad one fails there, alone."""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pika

from switchyard.core import tracing
from switchyard.rpc import frames, protocol

_CID_ROOM = 40  # bytes a correlation id may take: tag, slot and sequence number


@dataclass(slots=True)
class Call:
    """One request on its way: what the I/O thread publishes and the future it settles."""

    key: str
    routing_key: str
    body: bytes
    timeout: float
    props: pika.BasicProperties
    future: Future
    slot: int = 0
    seq: int = 0
    reply: bool = True  # False: sent without reply-to; done when the broker has it
    deadline: float = 0.0  # time.monotonic() past which its caller stops waiting (set with its slot)
    published_on: int = 0  # the connection it was last taken out of the outbox for (0: never)
    attempts: int = 0  # publishes: more than one, it was re-sent after a lost connection


def check_timeout(timeout: float) -> float:
    """A call's timeout, checked: a positive, finite number of seconds (ValueError otherwise)."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout)\
            or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return timeout


def encode_request(key: str, body: bytes | str, timeout: float, expiration_ms: int | None,
                   headers: Mapping[str, Any] | None, *, reply: bool, reply_queue: str,
                   frame_max: int) -> Call:
    """Validate a request and build its properties, so a bad one fails here, for its caller."""
    protocol.validate_key(key)
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif isinstance(body, bytearray | memoryview):
        body = bytes(body)
    elif not isinstance(body, bytes):
        raise TypeError(f"a request body must be bytes or str, not {type(body).__name__}")
    check_timeout(timeout)
    if expiration_ms is None:
        expiration_ms = max(1, int(timeout * 1000))
    elif isinstance(expiration_ms, bool) or not isinstance(expiration_ms, int) or expiration_ms < 0:
        raise ValueError(f"expiration_ms must be a non-negative integer, got {expiration_ms!r}")
    if headers is not None and not isinstance(headers, Mapping):
        raise TypeError(f"headers must be a mapping, not {type(headers).__name__}")
    msg_headers = {**headers, protocol.KEY_HEADER: key} if headers else {protocol.KEY_HEADER: key}
    if tracing.TRACEPARENT_HEADER not in msg_headers:  # the caller's trace, else the request in hand's
        msg_headers[tracing.TRACEPARENT_HEADER] = tracing.outgoing_traceparent()
    if tracing.trace_log_path() is not None:
        tracing.hop(tracing.parse(msg_headers[tracing.TRACEPARENT_HEADER]), "rpc", "publish", key=key)
    props = pika.BasicProperties(
        reply_to=reply_queue if reply else None,
        expiration=str(expiration_ms) if expiration_ms else None,  # 0: never expires
        headers=msg_headers,
        delivery_mode=pika.DeliveryMode.Persistent,
    )
    if headers:  # only the caller's headers can hold what AMQP cannot encode
        size = frames.encoded_size(props)  # ValueError: what pika cannot encode
    else:
        size = 320 + len(key.encode("utf-8"))  # the fixed properties, the key and traceparent headers
    if size + _CID_ROOM + frames.FRAME_OVERHEAD > frame_max:
        raise ValueError(f"request properties and headers take {size} bytes: more than the "
                         f"broker's frame size ({frame_max} bytes) can carry")
    return Call(key, protocol.routing_key(key), body, timeout, props, Future(), reply=reply)


def parse_correlation_id(tag: str, correlation_id: str | None) -> tuple[int, int] | None:
    """``(slot, seq)`` from a correlation id ``<tag>.<slot>.<seq>`` of the client tagged ``tag``;
    None for another client's or a malformed one."""
    if not correlation_id:
        return None
    parts = correlation_id.split(".")
    if len(parts) != 3 or parts[0] != tag:
        return None
    try:
        return int(parts[1]), int(parts[2])
    except ValueError:
        return None
