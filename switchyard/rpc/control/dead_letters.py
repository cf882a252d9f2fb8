"""The dead-letter responder's logic (the keyed RPC design, "osrdyne responds to dead lettered messages").

Every dead-lettered request with a reply-to gets a response through the default exchange with
its correlation id and ``x-status`` = the request's ``x-first-death-reason`` (RabbitMQ's header
name; the public osrdyne read ``x-first-death`` and never answered). Requests that died by
``delivery_limit`` also go to the poison inventory. All of it is confirmed before the batch is
acked. A request without reply-to is logged and counted; nothing crashes the batch. Each dead
letter is a hop of its trace: the response carries ``traceparent`` (the responder's span under the
request's) and the poison copy keeps the request's own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from switchyard.core import tracing
from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.control.orphans import negative_response, poison_copy
from switchyard.rpc.control.publisher import ConfirmingPublisher, Outgoing
from switchyard.rpc.control.rmq_event import AmqpMessage

UNKNOWN_REASON = "dead_lettered"
_PER_REASON = frozenset({protocol.Status.EXPIRED, protocol.Status.DELIVERY_LIMIT, protocol.Status.REJECTED,
                        protocol.Status.MAXLEN})


@dataclass
class DeadLetterOutcome:
    dead_letters: int = 0
    responses: int = 0
    poisoned: int = 0
    without_reply_to: int = 0
    without_reason: int = 0
    malformed_fields: int = 0
    undecodable: int = 0  # headers not decodable (amqp_decode): poisoned, and answered if it can be
    # Per reason (metrics DeadLetterExpired, ...: each has its own alarm).
    expired: int = 0
    delivery_limit: int = 0
    rejected: int = 0
    maxlen: int = 0


def death_reason(message: AmqpMessage) -> str | None:
    """``x-first-death-reason``, else the reason of the first ``x-death`` entry."""
    reason = message.header_str(protocol.FIRST_DEATH_REASON_HEADER)
    if reason:
        return reason
    deaths = message.headers.get(protocol.DEATH_HEADER)
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        first = deaths[0].get("reason")
        return first if isinstance(first, str) and first else None
    return None


def _details(message: AmqpMessage, reason: str) -> dict[str, Any]:
    return {
        "reason": reason,
        "key": message.key,
        "queue": message.header_str(protocol.FIRST_DEATH_QUEUE_HEADER),  # a str or None: always JSON
        "detail": "the request was dead-lettered before a worker answered it",
    }


def respond_dead_letters(
    messages: Iterable[AmqpMessage], *, pool: str, publisher: ConfirmingPublisher
) -> DeadLetterOutcome:
    outcome = DeadLetterOutcome()
    outgoing: list[Outgoing] = []
    for message in messages:
        outcome.dead_letters += 1
        outcome.malformed_fields += bool(message.problems)
        trace = tracing.from_headers(message.headers)
        with tracing.scope(trace):
            _respond(message, pool, trace, outcome, outgoing)
    publisher.publish_all(outgoing)
    return outcome


def _respond(message: AmqpMessage, pool: str, trace: tracing.TraceContext, outcome: DeadLetterOutcome,
             outgoing: list[Outgoing]) -> None:
    """Count one dead letter by reason; queue its poison copy and its response, if any."""
    reason = death_reason(message)
    if reason is None:
        outcome.without_reason += 1
        reason = UNKNOWN_REASON
        logger.warning("dead letter without x-first-death-reason",
                       extra={"pool": pool, "amqp_correlation_id": message.properties.correlation_id})
    if reason in _PER_REASON:
        setattr(outcome, reason, getattr(outcome, reason) + 1)
    poison_reason = message.undecodable or (reason if reason == protocol.Status.DELIVERY_LIMIT else None)
    if poison_reason is not None:
        outcome.poisoned += 1
        outcome.undecodable += poison_reason is message.undecodable
        outgoing.append(poison_copy(pool, message, poison_reason))
        logger.warning("poison request moved to the poison inventory",
                       extra={"pool": pool, "key": message.key,
                              "amqp_correlation_id": message.properties.correlation_id})
    reply = negative_response(message, reason, _details(message, reason), trace)
    tracing.hop(trace, "rpc", "dead-lettered", pool=pool, key=message.key, reason=reason)
    if reply is None:
        outcome.without_reply_to += 1
        logger.info("dead letter without reply-to: no one to answer",
                    extra={"pool": pool, "reason": reason, "key": message.key})
        return
    outcome.responses += 1
    outgoing.append(reply)
