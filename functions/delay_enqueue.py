"""Delay scheduler, consume and enqueue: MSK event source on the input topic.

Returns only after the batch is persisted, so the mapping commits offsets only for stored (or
confirmed-fired) records; an error re-delivers the batch, which the message id makes harmless.
Bad records are dropped (logged, counted) and never fail the batch.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import KafkaEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from switchyard.delay import runtime
from switchyard.delay.msk import records_from_kafka_event
from switchyard.observability import logger, metrics

tracer = Tracer()


@metrics.log_metrics
@tracer.capture_lambda_handler
@logger.inject_lambda_context
@event_source(data_class=KafkaEvent)
def lambda_handler(event: KafkaEvent, context: LambdaContext) -> dict[str, Any]:
    outcome = runtime.service().enqueue(records_from_kafka_event(event))
    metrics.add_metric(name="DelayRecordsReceived", unit=MetricUnit.Count, value=outcome.received)
    metrics.add_metric(name="DelayMessagesEnqueued", unit=MetricUnit.Count, value=outcome.enqueued)
    metrics.add_metric(name="DelayDuplicatesIgnored", unit=MetricUnit.Count, value=outcome.duplicates)
    metrics.add_metric(name="DelayFiredImmediately", unit=MetricUnit.Count, value=outcome.fired_immediately)
    metrics.add_metric(name="DelayRecordsDropped", unit=MetricUnit.Count, value=len(outcome.dropped))
    return asdict(outcome)
