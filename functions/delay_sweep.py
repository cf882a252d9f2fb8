"""Delay scheduler, failure detection and recovery: on a schedule, sweeps every detection interval.

Rows readied longer ago than the hold time are reset (compare-and-set) and the suspected node logged.
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
    outcome = runtime.service().sweep(context.get_remaining_time_in_millis)
    metrics.add_metric(name="DelaySuspectedFailures", unit=MetricUnit.Count, value=outcome.reset)
    metrics.add_metric(name="DelayStoreErrors", unit=MetricUnit.Count, value=outcome.store_errors)
    return asdict(outcome)
