"""Delay scheduler, consume and enqueue: MSK event source on the input topic.

Returns only after the batch is persisted, so the mapping commits offsets only for stored (or
confirmed-fired) records; an error re-delivers the batch, which the message id makes harmless.
Bad records are dropped (logged, counted) and never fail the batch.
"""

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import KafkaEvent

from switchyard.delay import runtime
from switchyard.delay.model import EnqueueOutcome
from switchyard.delay.msk import records_from_kafka_event
from switchyard.observability import lambda_handler_for, metrics


def report(outcome: EnqueueOutcome) -> None:
    metrics.add_metric(name="DelayRecordsReceived", unit=MetricUnit.Count, value=outcome.received)
    metrics.add_metric(name="DelayMessagesEnqueued", unit=MetricUnit.Count, value=outcome.enqueued)
    metrics.add_metric(name="DelayDuplicatesIgnored", unit=MetricUnit.Count, value=outcome.duplicates)
    metrics.add_metric(name="DelayFiredImmediately", unit=MetricUnit.Count, value=outcome.fired_immediately)
    metrics.add_metric(name="DelayRecordsDropped", unit=MetricUnit.Count, value=len(outcome.dropped))


lambda_handler = lambda_handler_for(
    lambda event, _context: runtime.service().enqueue(records_from_kafka_event(event)),
    data_class=KafkaEvent,
    report=report,
)
