"""At-least-once dead-lettering, used where it is safe, retired before deletes, and probed.

RabbitMQ's open issue #16652 (seen on 4.2.4, reproduced here on 4.0.5): a quorum queue with
``dead-letter-strategy: at-least-once`` runs a dead-letter worker under one node-wide supervisor,
``rabbit_fifo_dlx_sup``. Deleting such a queue while its worker starts (the second after a broker
restart or a leader move) crash-loops the worker until the supervisor gives up; from then on every
at-least-once queue that starts or elects a leader crashes (``INTERNAL_ERROR`` on declare) and the
running ones stop dead-lettering, until the node restarts. On Amazon MQ that means a reboot.

So Switchyard:

- uses at-least-once only on the orphan staging queue, where a dead letter is a request in transit.
  Request, orphan and activity-staging queues dead-letter at-most-once: their dead letters are
  answers about failure (the caller's own timeout stands behind them) or activity hints;
- never deletes an at-least-once queue as it is: ``retired`` first turns its strategy to
  at-most-once by an exact-name policy, which stops its worker cleanly (measured: 50 queues deleted
  within a second of a restart, four runs, the supervisor survived every time; without it ONE queue
  stopped it every time);
- probes the broker (``probe``): on every running node of it, a fresh at-least-once queue led by
  that node is declared, retired and deleted; an ``INTERNAL_ERROR`` means that node's supervisor is
  gone, reported with the node and the one recovery there is. Each node of a cluster has its own
  supervisor, and a queue starts its worker on its leader's node only: a probe on the node its
  connection reached would miss a stranded neighbour.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from switchyard.core.config import service_urls
from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.control.management import ManagementApi, vhost_from_amqp_url
from switchyard.rpc.errors import DeadLetteringStrandedError, ManagementApiError

RETIRE_SETTLE_S = 0.2
RECOVERY = (
    "RabbitMQ's at-least-once dead-letter supervisor has stopped (rabbitmq-server#16652): no quorum "
    "queue with at-least-once dead-lettering can start, and orphans wait in the staging queues. "
    "Reboot the broker to recover (Amazon MQ: aws mq reboot-broker --broker-id ID; elsewhere restart "
    "the node); nothing waiting is lost, it moves on after the reboot."
)


@dataclass(frozen=True)
class ProbeResult:
    stranded: bool
    detail: str
    nodes: tuple[str, ...] = ()  # the stranded nodes


def broker_id(amqp_url: str) -> str:
    """Names one broker and vhost (credentials left out), for the probe's turn shared by every pool;
    a cluster's list of URLs in any order names the same."""
    urls = service_urls(amqp_url) or [amqp_url]
    nodes = sorted(f"{parts.hostname}:{parts.port}" for parts in map(urlsplit, urls))
    where = f"{','.join(nodes)}/{vhost_from_amqp_url(amqp_url)}"
    return hashlib.sha256(where.encode("utf-8")).hexdigest()[:16]


def stranded_error(what: str) -> DeadLetteringStrandedError:
    return DeadLetteringStrandedError(f"{what}: the broker answered INTERNAL_ERROR. {RECOVERY}")


def is_stranding(exc: BaseException) -> bool:
    """Whether a broker error is the stranded supervisor's ``INTERNAL_ERROR`` on a declare."""
    return (isinstance(exc, pika.exceptions.ConnectionClosedByBroker)
            and exc.reply_code == protocol.INTERNAL_ERROR)


def is_stranding_answer(exc: ManagementApiError) -> bool:
    """Whether the management API's refusal of a declare is the stranded supervisor's: the node's
    call to ``rabbit_fifo_dlx_sup`` found no process (an AMQP declare gets ``INTERNAL_ERROR``)."""
    return exc.status == 400 and "rabbit_fifo_dlx_sup" in exc.body


def retire_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """``definition`` with at-most-once dead-lettering: what the queue gets for its last moments."""
    return {**definition, protocol.DEAD_LETTER_STRATEGY: protocol.AT_MOST_ONCE}


@contextlib.contextmanager
def retired(management: ManagementApi, queue: str, definition: dict[str, Any],
            priority: int) -> Iterator[None]:
    """Turn ``queue``'s dead-lettering at-most-once for the duration (delete the queue inside).

    The exact-name policy outranks the queue's own. The broker hands it to the queue before the
    management call returns (measured: no wait needed in 200 deletions right after restarts); the
    short settle is margin. The management API's ``policy`` field lags by seconds: not a signal.
    """
    name = protocol.retire_policy_name(queue)
    management.put_policy(name, protocol.exact_queue_pattern(queue), retire_definition(definition),
                          priority + 1)
    try:
        time.sleep(RETIRE_SETTLE_S)
        yield
    finally:
        management.delete_policy(name)


def probe_definition() -> dict[str, Any]:
    """At-least-once dead-lettering into a queue nobody declares: the probe's queues hold nothing."""
    return {"dead-letter-exchange": "", "dead-letter-routing-key": protocol.DEAD_LETTER_PROBE_PREFIX + "sink",
            protocol.DEAD_LETTER_STRATEGY: protocol.AT_LEAST_ONCE, "overflow": "reject-publish"}


# The probe's queues. The first spans every node (a group larger than any cluster): its members name
# the nodes, which the management API lists only to monitoring users, and the node that answered the
# declare leads it. Each other node then declares one of a single member, which it leads.
SPANNING_GROUP_SIZE = 255
PROBE_QUEUE_ARGUMENTS = {protocol.QUEUE_TYPE_ARGUMENT: protocol.QueueType.QUORUM.value,
                         protocol.LEADER_LOCATOR_ARGUMENT: protocol.CLIENT_LOCAL}


def probe(channel: Callable[[], BlockingChannel], management: ManagementApi, priority: int) -> ProbeResult:
    """On each running node, declare a fresh at-least-once quorum queue that the node leads (its leader
    starts a dead-letter worker under the node's supervisor), then retire and delete it. Costs a
    policy write, and per node a declare, a read, a delete and two policy writes."""
    for leftover in management.list_queues(f"^{protocol.DEAD_LETTER_PROBE_PREFIX}", columns="name"):
        _remove(channel, management, leftover["name"], priority)  # an earlier probe's, on a stranded broker
    management.put_policy(protocol.DEAD_LETTER_PROBE_POLICY, f"^{protocol.DEAD_LETTER_PROBE_PREFIX}",
                          probe_definition(), priority)
    started, first = _starts_on(channel, management, None, priority)
    leader = first.get("leader") or first.get("node") or "the node that answered"
    others = sorted(set(first.get("online") or ()) - {leader})
    stranded = tuple([] if started else [leader]) + tuple(
        node for node in others if not _starts_on(channel, management, node, priority)[0])
    if stranded:
        logger.error("at-least-once dead-lettering is stranded", extra={"nodes": stranded,
                                                                         "recovery": RECOVERY})
        return ProbeResult(True, f"stranded on {', '.join(stranded)}: {RECOVERY}", stranded)
    return ProbeResult(False, f"a new at-least-once quorum queue started on each of {len(others) + 1} "
                              "node(s)")


def _starts_on(channel: Callable[[], BlockingChannel], management: ManagementApi, node: str | None,
               priority: int) -> tuple[bool, dict[str, Any]]:
    """Whether an at-least-once queue led by ``node`` starts (the declare runs there; None: a queue on
    every node, led by the node that answers), and the queue as listed. A stranded node refuses the
    declare but keeps the queue's record: removed either way."""
    queue = protocol.DEAD_LETTER_PROBE_PREFIX + uuid.uuid4().hex[:16]
    size = SPANNING_GROUP_SIZE if node is None else 1
    try:
        management.declare_queue(queue, {**PROBE_QUEUE_ARGUMENTS, protocol.INITIAL_GROUP_SIZE_ARGUMENT: size},
                                 node)
        started = True
    except ManagementApiError as exc:
        if not is_stranding_answer(exc):
            raise
        started = False
    try:
        return started, management.get_queue(queue) or {}
    finally:
        _remove(channel, management, queue, priority)


def _remove(channel: Callable[[], BlockingChannel], management: ManagementApi, queue: str,
            priority: int) -> None:
    """Delete a probe queue; one a stranded broker could not start is deleted as well as it can be."""
    try:
        with retired(management, queue, probe_definition(), priority):
            channel().queue_delete(queue)
    except pika.exceptions.AMQPError:
        logger.warning("probe queue left for the next probe to remove", extra={"queue": queue})
