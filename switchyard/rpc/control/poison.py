"""A pool's poison inventory, ``{pool}-poison``: read it, and send its requests back once fixed.

Workers and the control plane set a message aside there, with why (``x-switchyard-poison-reason``),
when it cannot be handled as it is: delivered too many times (a handler that crashed on it),
headers no decoder reads, a key no worker can carry. Nothing reads the queue on its own: a person
looks (``switchyard pool poison``), fixes the cause (a handler's bug, a deploy), then replays
(``--replay``). A replayed request goes back to the pool's request exchange under its key, as a
client would send it: a group serving the key takes it, else the orphan path starts one.

At least once: each copy is acknowledged on the poison queue only after the broker confirmed its
republication, so a crash between the two leaves it in both places (a duplicate, never a loss).
A message without a key header (its headers were undecodable, or it never was a request) stays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pika

from switchyard.core.errors import InvalidNameError
from switchyard.rpc import protocol
from switchyard.rpc.amqp import connect
from switchyard.rpc.control.orphans import republishable
from switchyard.rpc.control.publisher import ConfirmingPublisher, Outgoing
from switchyard.rpc.settings import RpcSettings

# Headers of the copy's past lives: dropped on replay, so the request starts afresh (a delivery
# count, the deaths that led here, the reason it was set aside).
_PAST_HEADERS = ("x-death", "x-first-death-", "x-last-death-", "x-delivery-count",
                 protocol.POISON_REASON_HEADER)


@dataclass(frozen=True)
class PoisonMessage:
    """One message of the inventory, as ``pool poison`` lists it."""

    key: str | None  # None: no key header (not replayable)
    reason: str
    correlation_id: str | None
    reply_to: str | None
    size: int

    @classmethod
    def of(cls, props: pika.BasicProperties, body: bytes) -> PoisonMessage:
        headers = props.headers or {}
        key = headers.get(protocol.KEY_HEADER)
        # Set aside by Switchyard (the reason header), or dead-lettered here by the broker (a delivery limit)
        reason = headers.get(protocol.POISON_REASON_HEADER) or headers.get(protocol.FIRST_DEATH_REASON_HEADER)
        reason = reason if reason is not None else "unknown"
        return cls(_text(key) if key is not None else None, _text(reason), props.correlation_id,
                   props.reply_to, len(body))


@dataclass
class ReplayOutcome:
    replayed: int = 0
    kept: int = 0  # no usable key: left in the queue
    keys: set[str] = field(default_factory=set)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


_Taken = list[tuple[int, Any, bytes]]  # (delivery tag, properties, body)


@contextlib.contextmanager
def _taken(settings: RpcSettings, pool: str, limit: int) -> Iterator[tuple[Any, _Taken]]:
    """Up to ``limit`` messages of the poison queue, unacknowledged: what is not acknowledged
    inside the block goes back when its channel closes."""
    connection = connect(settings.connections.amqp_url, f"switchyard-poison-{pool}")
    try:
        channel = connection.channel()
        taken = []
        for _ in range(limit):
            method, props, body = channel.basic_get(protocol.poison_queue(pool), auto_ack=False)
            if method is None:
                break
            taken.append((method.delivery_tag, props, body))
        yield channel, taken
    finally:
        connection.close()


def list_poison(settings: RpcSettings, pool: str, limit: int) -> list[PoisonMessage]:
    """The first ``limit`` messages of the inventory; every one stays where it is."""
    with _taken(settings, pool, limit) as (_, taken):
        return [PoisonMessage.of(props, body) for _, props, body in taken]


def _replay_copy(pool: str, props: pika.BasicProperties, body: bytes) -> tuple[str, Outgoing] | None:
    key = PoisonMessage.of(props, body).key
    if key is None:
        return None
    try:
        routing = protocol.routing_key(key)
    except InvalidNameError:  # a key no worker can carry: it stays set aside
        return None
    headers = {name: value for name, value in (props.headers or {}).items()
               if not name.startswith(_PAST_HEADERS)}
    return key, Outgoing(protocol.req_exchange(pool), routing, body,
                         republishable(props, headers, props.expiration), mandatory=True)


def replay_poison(settings: RpcSettings, pool: str, limit: int) -> ReplayOutcome:
    """Send up to ``limit`` set-aside requests back to the pool under their keys (see the module)."""
    outcome = ReplayOutcome()
    publisher = ConfirmingPublisher(settings.connections.amqp_url, f"switchyard-poison-replay-{pool}")
    try:
        with _taken(settings, pool, limit) as (channel, taken):
            replays = []
            for tag, props, body in taken:
                copy = _replay_copy(pool, props, body)
                if copy is None:
                    outcome.kept += 1
                    continue
                replays.append((tag, copy[1]))
                outcome.keys.add(copy[0])
            if replays:
                publisher.publish_all([out for _, out in replays])  # confirmed, or BrokerError
                for tag, _ in replays:
                    channel.basic_ack(tag)
                outcome.replayed = len(replays)
    finally:
        publisher.close()
    return outcome
