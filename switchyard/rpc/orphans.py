"""The orphan handler's logic: requests that found no bound queue (seed 000, "Worker group startup").

For a batch: group the orphans by key (read from ``x-switchyard-key``: the Lambda event has no
routing key), and under the keys' locks mark each group Active (new generation), declare and bind
its queue, and forward every orphan to the request exchange with its body, properties and headers
intact, waiting for every confirm. Then ask the driver to start each key's group once. Anything
that fails before the confirms raises, so the batch is redelivered: duplicates, never losses.
An orphan without a key cannot be routed: it goes to the poison inventory (and gets a negative
response if it has a reply-to), confirmed like the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import pika

from switchyard.observability import logger
from switchyard.rpc import protocol as p
from switchyard.rpc.drivers import WorkerGroup, WorkerGroupDriver
from switchyard.rpc.publisher import ConfirmingPublisher, Outgoing
from switchyard.rpc.rmq_event import AmqpMessage
from switchyard.rpc.state import PoolState
from switchyard.rpc.topology import PoolTopology


@dataclass
class OrphanOutcome:
    orphans: int = 0
    forwarded: int = 0
    keys: int = 0
    new_groups: int = 0
    without_key: int = 0
    malformed_fields: int = 0
    group_starts: int = 0
    group_start_failures: int = 0


def poison_copy(pool: str, message: AmqpMessage, reason: str) -> Outgoing:
    """The message as it was, into the pool's poison inventory, with why it is there."""
    props = message.properties
    headers = {**message.headers, p.POISON_REASON_HEADER: reason}
    copy = pika.BasicProperties(**{**props.__dict__, "headers": headers, "expiration": None})
    return Outgoing("", p.poison_queue(pool), message.body, copy)


def negative_response(message: AmqpMessage, status: str, detail: dict) -> Outgoing | None:
    """A protocol response for the caller waiting on ``reply-to``, if there is one."""
    reply_to = message.properties.reply_to
    if not reply_to:
        return None
    props = pika.BasicProperties(correlation_id=message.properties.correlation_id,
                                 headers={p.STATUS_HEADER: status}, content_type="application/json")
    return Outgoing("", reply_to, json.dumps(detail).encode(), props)


def forward_orphans(
    messages: Iterable[AmqpMessage],
    *,
    state: PoolState,
    topology: PoolTopology,
    publisher: ConfirmingPublisher,
    driver: WorkerGroupDriver,
) -> OrphanOutcome:
    pool = topology.pool
    outcome = OrphanOutcome()
    by_key: dict[str, list[AmqpMessage]] = {}
    outgoing: list[Outgoing] = []
    for message in messages:
        outcome.orphans += 1
        outcome.malformed_fields += bool(message.problems)
        key = message.key
        if key is None:
            outcome.without_key += 1
            logger.error("orphan without x-switchyard-key sent to the poison inventory",
                         extra={"pool": pool, "correlation_id": message.properties.correlation_id})
            outgoing.append(poison_copy(pool, message, "missing x-switchyard-key header"))
            reply = negative_response(message, p.Status.ERROR, {
                "error": "MissingKey", "message": f"requests must carry the {p.KEY_HEADER} header"})
            if reply is not None:
                outgoing.append(reply)
            continue
        by_key.setdefault(key, []).append(message)
    outcome.keys = len(by_key)

    with state.locked(by_key):
        touched = state.touch(by_key)
        became_active = [key for key, touch in touched.items() if touch.became_active]
        outcome.new_groups = len(became_active)
        topology.ensure_request_queues(by_key, likely_new=became_active)
        for key, batch in by_key.items():
            exchange, routing_key = p.req_exchange(pool), p.routing_key(key)
            outgoing.extend(Outgoing(exchange, routing_key, m.body, m.properties, mandatory=True)
                            for m in batch)
        publisher.publish_all(outgoing)
    outcome.forwarded = sum(len(batch) for batch in by_key.values())

    for key in by_key:
        try:
            driver.start(WorkerGroup(pool, key))
            outcome.group_starts += 1
        except Exception:  # the reconciler's group loop retries the start
            outcome.group_start_failures += 1
            logger.exception("worker group start failed; the reconciler will retry",
                             extra={"pool": pool, "key": key})
    return outcome
