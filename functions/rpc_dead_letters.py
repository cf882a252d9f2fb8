"""RPC dead-letter responder: Amazon MQ event source on ``{pool}-dl``.

Answers each dead-lettered request with its ``x-first-death-reason``, moves poison requests to
``{pool}-poison``, and returns only once every publish is confirmed.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Tracer
from aws_lambda_powertools.utilities.data_classes import event_source
from aws_lambda_powertools.utilities.data_classes.rabbit_mq_event import RabbitMQEvent
from aws_lambda_powertools.utilities.typing import LambdaContext

from switchyard.observability import emit_counts, logger, metrics
from switchyard.rpc.control_plane import control_plane
from switchyard.rpc.rmq_event import messages_from_event

tracer = Tracer()


@metrics.log_metrics
@tracer.capture_lambda_handler
@logger.inject_lambda_context
@event_source(data_class=RabbitMQEvent)
def lambda_handler(event: RabbitMQEvent, context: LambdaContext) -> dict[str, Any]:
    outcome = control_plane().respond_dead_letters(messages_from_event(event))
    emit_counts(outcome, prefix="DeadLetter")
    return asdict(outcome)
