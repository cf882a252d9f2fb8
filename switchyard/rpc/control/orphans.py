"""The orphan handler's logic: requests that found no bound queue (keyed RPC, "Worker group startup").

For a batch: group the orphans by key (``x-switchyard-key``, else the routing key that the staging
hop wrote into ``x-death``: the Lambda event has no routing key), and under the keys' locks mark
each group Active (new generation), declare and bind its queue, and forward every orphan to the
request exchange with its body, properties and headers, waiting for every confirm. Then ask the
driver to start each key's group once. Anything that fails before the confirms raises, so the
batch is redelivered: duplicates, never losses.

Forwarding undoes the staging hop: its death bookkeeping is stripped (a later death of the
request must read as its own), the key goes into ``x-switchyard-key``, and the request's own
``expiration``, which dead-lettering moved into ``x-death``, is restored minus the time spent since
(``x-death`` times have one-second resolution: the estimate is centred, within 0.5 s). An orphan
whose time is already up is answered ``expired`` at once. ``user_id`` moves into a header: the
broker refuses a ``user_id`` that is not the publishing connection's own.
An orphan without a key cannot be routed: it goes to the poison inventory (and gets a negative
response if it has a reply-to), confirmed like the rest.

Each orphan is a hop of its trace: the forwarded copy's ``traceparent`` is the orphan handler's
own span under the request's (a new trace if it had none or a malformed one), and so is a
negative response's; its log lines carry the trace id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pika

from switchyard.core import tracing
from switchyard.core.errors import InvalidNameError
from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.amqp_decode import TolerantProperties
from switchyard.rpc.control.publisher import ConfirmingPublisher, Outgoing
from switchyard.rpc.control.rmq_event import AmqpMessage, timestamp_seconds
from switchyard.rpc.ports import PoolStore, RequestQueues, WorkerGroup, WorkerGroupDriver, now_ms


@dataclass
class OrphanOutcome:
    orphans: int = 0
    forwarded: int = 0
    keys: int = 0
    new_groups: int = 0
    without_key: int = 0
    expired: int = 0
    malformed_fields: int = 0
    group_starts: int = 0
    group_start_failures: int = 0
    undecodable: int = 0  # headers not decodable (amqp_decode): poisoned
    invalid_key: int = 0  # a key no worker can carry (NUL, over MAX_KEY_BYTES): poisoned


def republishable(props: pika.BasicProperties, headers: dict[str, Any],
                  expiration: str | None) -> pika.BasicProperties:
    """``props`` with ``headers`` and ``expiration``, and its ``user_id`` (which the broker checks
    against the publishing connection's user) kept in a header instead."""
    fields: dict[str, Any] = {**props.__dict__, "headers": headers, "expiration": expiration}
    user_id = fields.pop("user_id", None)
    if user_id is not None:
        headers[protocol.ORIGINAL_USER_ID_HEADER] = user_id
    return TolerantProperties(**fields)


def poison_copy(pool: str, message: AmqpMessage, reason: str) -> Outgoing:
    """The message as it was, into the pool's poison inventory, with why it is there."""
    headers = {**message.headers, protocol.POISON_REASON_HEADER: reason}
    return Outgoing("", protocol.poison_queue(pool), message.body,
                    republishable(message.properties, headers, None))


def remaining_expiration_ms(message: AmqpMessage, at_ms: int) -> int | None:
    """What is left of the request's expiration once the staging hop is undone (None: it has none).

    Dead-lettering moved it into the staging death's ``original-expiration``; the time spent since
    is measured from that death's ``time`` (whole seconds: add half a second to centre it)."""
    staged = message.death(protocol.STAGING_SUFFIX)
    original = staged.get("original-expiration") if staged else None
    if not (isinstance(original, str) and original.isascii() and original.isdigit()):
        own = message.properties.expiration  # validated digits, or None
        return int(own) if own is not None else None
    died_s = timestamp_seconds(staged.get("time")) if staged else None
    if died_s is None:
        return int(original)  # the time spent is unknown: keep the whole expiration
    return int(original) - max(0, at_ms - int(died_s * 1000 + 500))


def forwarded_properties(message: AmqpMessage, key: str, expiration: str | None,
                         trace: tracing.TraceContext | None = None) -> pika.BasicProperties:
    # A producer's own user-id header goes too: the header is this handler's, for the checked user_id.
    headers = {name: value for name, value in message.headers.items()
               if not name.startswith(protocol.BROKER_BOOKKEEPING_PREFIXES)
               and name != protocol.ORIGINAL_USER_ID_HEADER}
    headers[protocol.KEY_HEADER] = key
    if trace is not None:
        headers[tracing.TRACEPARENT_HEADER] = trace.traceparent
    return republishable(message.properties, headers, expiration)


def negative_response(message: AmqpMessage, status: str, detail: dict,
                      trace: tracing.TraceContext | None = None) -> Outgoing | None:
    """A protocol response for the caller waiting on ``reply-to``, if there is one, in the
    request's trace (``trace``: this hop's span, else one under the request's ``traceparent``)."""
    reply_to = message.properties.reply_to
    if not protocol.replyable(reply_to):  # none, or a queue no answer may go to
        return None
    trace = trace or tracing.from_headers(message.headers)
    headers = {protocol.STATUS_HEADER: status, tracing.TRACEPARENT_HEADER: trace.traceparent}
    props = pika.BasicProperties(correlation_id=message.properties.correlation_id, headers=headers,
                                 content_type="application/json")
    return Outgoing("", reply_to, json.dumps(detail).encode(), props)


def forward_orphans(
    messages: Iterable[AmqpMessage],
    *,
    state: PoolStore,
    topology: RequestQueues,
    publisher: ConfirmingPublisher,
    driver: WorkerGroupDriver,
) -> OrphanOutcome:
    pool = topology.pool
    outcome = OrphanOutcome()
    outgoing: list[Outgoing] = []
    forwards: dict[str, list[tuple[bytes, pika.BasicProperties]]] = {}
    at_ms = now_ms()
    traces: dict[str, list[tracing.TraceContext]] = {}
    for message in messages:
        outcome.orphans += 1
        outcome.malformed_fields += bool(message.problems)
        trace = tracing.from_headers(message.headers)
        with tracing.scope(trace):
            forward = _sort_orphan(message, pool, at_ms, trace, outcome, outgoing)
        if forward is not None:
            key, props = forward
            forwards.setdefault(key, []).append((message.body, props))
            traces.setdefault(key, []).append(trace)
    outcome.keys = len(forwards)

    with state.locked(forwards):
        touched = state.touch(forwards)
        became_active = [key for key, touch in touched.items() if touch.became_active]
        outcome.new_groups = len(became_active)
        topology.ensure_request_queues(forwards, likely_new=became_active)
        for key, batch in forwards.items():
            exchange, routing_key = protocol.req_exchange(pool), protocol.routing_key(key)
            for body, props in batch:
                props.user_id = publisher.user  # checked: workers trust the user-id header from it
                outgoing.append(Outgoing(exchange, routing_key, body, props, mandatory=True))
        publisher.publish_all(outgoing)
    outcome.forwarded = sum(len(batch) for batch in forwards.values())

    new_groups = set(became_active)
    for key in forwards:
        for trace in traces[key]:
            tracing.hop(trace, "rpc", "orphan forwarded", pool=pool, key=key, cold_start=key in new_groups)
        try:
            driver.start(WorkerGroup(pool, key))
            outcome.group_starts += 1
        except Exception:  # the reconciler's group loop retries the start
            outcome.group_start_failures += 1
            logger.exception("worker group start failed; the reconciler will retry",
                             extra={"pool": pool, "key": key})
            continue
        if key in new_groups:
            for trace in traces[key]:
                tracing.hop(trace, "rpc", "group started", pool=pool, key=key)
    return outcome


def _sort_orphan(message: AmqpMessage, pool: str, at_ms: int, trace: tracing.TraceContext,
                 outcome: OrphanOutcome, outgoing: list[Outgoing]) -> tuple[str, pika.BasicProperties] | None:
    """The key and properties to forward one orphan with, or None when it was answered or poisoned."""
    key = _checked_key(message)
    if isinstance(key, tuple):
        counter, reason, error, detail = key
        setattr(outcome, counter, getattr(outcome, counter) + 1)
        logger.error("orphan sent to the poison inventory", extra={
            "pool": pool, "reason": counter, "amqp_correlation_id": message.properties.correlation_id})
        outgoing.append(poison_copy(pool, message, reason))
        reply = negative_response(message, protocol.Status.ERROR, {"error": error, "message": detail}, trace)
        if reply is not None:
            outgoing.append(reply)
        tracing.hop(trace, "rpc", f"orphan {counter.replace('_', ' ')}", pool=pool)
        return None
    left_ms = remaining_expiration_ms(message, at_ms)
    if left_ms is not None and left_ms <= 0:
        outcome.expired += 1
        reply = negative_response(message, protocol.Status.EXPIRED, {
            "reason": protocol.Status.EXPIRED, "key": key,
            "detail": "the request expired before a worker group could take it"}, trace)
        if reply is not None:
            outgoing.append(reply)
        tracing.hop(trace, "rpc", "orphan expired", pool=pool, key=key)
        return None
    expiration = str(left_ms) if left_ms is not None else None
    return key, forwarded_properties(message, key, expiration, trace)


def _checked_key(message: AmqpMessage) -> str | tuple[str, str, str, str]:
    """The orphan's key, or why it cannot be forwarded: (its outcome counter, the poison reason, the
    negative response's error and message)."""
    key = message.key
    if (undecodable := message.undecodable) is not None:
        return "undecodable", undecodable, "UndecodableHeaders", undecodable
    if key is None:
        return ("without_key", "no key: no routing key or x-switchyard-key header", "MissingKey",
                f"requests must carry their key as routing key (at most {protocol.MAX_NAME_BYTES} bytes) "
                f"or in the {protocol.KEY_HEADER} header")
    try:
        protocol.validate_key(key)
    except InvalidNameError as exc:  # its message shows the key escaped (no raw NUL in a log)
        return "invalid_key", f"invalid key: {exc}", "InvalidKey", str(exc)
    return key
