"""Delay scheduler, ready and fire: on a schedule, loops until the invocation's time runs short.

Each readied message is published at its deadline minus the timing advance and deleted only after
the broker confirmed it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from switchyard.delay import runtime
from switchyard.observability import logger, metrics

tracer = Tracer()


@metrics.log_metrics
@tracer.capture_lambda_handler
@logger.inject_lambda_context
@event_source(data_class=EventBridgeEvent)
def lambda_handler(event: EventBridgeEvent, context: LambdaContext) -> dict[str, Any]:
    outcome = runtime.service().fire(context.get_remaining_time_in_millis)
    metrics.add_metric(name="DelayMessagesReadied", unit=MetricUnit.Count, value=outcome.readied)
    metrics.add_metric(name="DelayMessagesFired", unit=MetricUnit.Count, value=outcome.fired)
    metrics.add_metric(name="DelayMessagesGoneAtDelete", unit=MetricUnit.Count, value=outcome.gone_at_delete)
    metrics.add_metric(name="DelayPublishFailures", unit=MetricUnit.Count, value=outcome.publish_failures)
    metrics.add_metric(name="DelayStoreErrors", unit=MetricUnit.Count, value=outcome.store_errors)
    metrics.add_metric(name="DelayMaxTimerLateness", unit=MetricUnit.Milliseconds, value=outcome.max_late_ms)
    return asdict(outcome)
