"""The properties of what a worker makes of a request: its shed copy, its poison copy, and the
headers its handler is given."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import pika

from switchyard.rpc import protocol
from switchyard.rpc.amqp_decode import TolerantProperties
from switchyard.rpc.worker.request import count_header


def shed_properties(props: pika.BasicProperties, received_ms: int, now_ms: int,
                    worker_user: str | None) -> pika.BasicProperties:
    """The properties of a shed request's copy: everything kept, the clocks carried in headers.

    The copy's expiration is what remains of the original (measured from the first receipt by a
    worker, or from an earlier shed's deadline); ``user_id``, which the broker checks against the
    republishing connection's user, moves into ``x-switchyard-user-id`` as the orphan handler's does
    (a producer's own header there would otherwise read as checked on the copy's delivery). The
    copy's own ``user_id`` is the worker's user: the broker checks it, and a worker serves a request
    that came straight into its queue only from that user (``bypassed``).
    """
    headers = dict(props.headers or {})
    previous = count_header(headers, protocol.DELIVERY_COUNT_HEADER)
    headers.pop(protocol.DELIVERY_COUNT_HEADER, None)
    headers[protocol.REDELIVERIES_HEADER] = count_header(headers, protocol.REDELIVERIES_HEADER) + previous + 1
    expiration = props.expiration
    deadlines = []
    if props.expiration and props.expiration.isdigit():
        deadlines.append(received_ms + int(props.expiration))
    with contextlib.suppress(KeyError, TypeError, ValueError):
        deadlines.append(int(headers[protocol.DEADLINE_HEADER]))
    if deadlines:
        deadline = min(deadlines)
        headers[protocol.DEADLINE_HEADER] = deadline
        expiration = str(max(0, deadline - now_ms))
    if props.user_id:
        headers[protocol.ORIGINAL_USER_ID_HEADER] = props.user_id
    fields = {**vars(props), "headers": headers, "expiration": expiration, "user_id": worker_user}
    return TolerantProperties(**fields)


def poison_properties(props: pika.BasicProperties, reason: str) -> pika.BasicProperties:
    """The request as it came, with why it is in the poison inventory (no ``user_id``: the broker
    checks it against the worker's user; no expiration: a person reads it later)."""
    headers = {**(props.headers or {}), protocol.POISON_REASON_HEADER: reason}
    return TolerantProperties(**{**vars(props), "headers": headers, "user_id": None, "expiration": None})


def bypassed(exchange: str, user_id: str | None, worker_user: str | None, queue: str) -> str | None:
    """Why a request that did not come through the pool's request exchange is refused (None: it
    may be served). Straight into the queue (the default exchange, which every role that answers
    may write to: another pool's workers too) come only this pool's own shed copies, which carry
    the broker-checked ``user_id`` of the worker's own user; anything else would let a stranger
    have this pool's handler answer it, into a reply queue of the stranger's choosing."""
    if exchange != "" or user_id == worker_user:
        return None
    return f"published straight into {queue!r} by user {user_id!r}, not through the pool's request exchange"


def handler_headers(props: pika.BasicProperties, republished: bool, forwarder: str) -> Mapping[str, Any]:
    """The request's headers for its handler. ``x-switchyard-user-id`` is where the orphan handler
    and a shed copy keep a request's broker-checked ``user_id``; it is believed only from them: the
    worker's own copy (``republished``: straight into the queue, by the worker's user) and a request
    whose checked ``user_id`` is the pool's orphans user (``forwarder``). Elsewhere a producer's own
    header is replaced by the ``user_id`` the broker checked, or dropped where there is none."""
    headers = props.headers or {}
    if protocol.ORIGINAL_USER_ID_HEADER not in headers or republished or props.user_id == forwarder:
        return headers
    if props.user_id:
        return {**headers, protocol.ORIGINAL_USER_ID_HEADER: props.user_id}
    return {name: value for name, value in headers.items() if name != protocol.ORIGINAL_USER_ID_HEADER}
