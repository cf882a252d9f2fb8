"""Delay scheduler, consume and enqueue: MSK event source on the input topic (ReportBatchItemFailures).

Returns only after the batch is persisted, so the mapping commits offsets only for stored (or
confirmed-fired) records. Bad records are dropped (logged, counted) and never fail the batch; a
record that could not be stored for a transient reason is named in the partial batch response, so
the mapping delivers its partition again from it; an unreachable Postgres fails the whole batch.
"""

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import KafkaEvent

from switchyard.core.observability import lambda_handler_for, metrics
from switchyard.delay.model import EnqueueOutcome
from switchyard.delay.msk import partial_batch_response, records_from_kafka_event
from switchyard.delay.service import service


def enqueue(event: KafkaEvent, _context: object) -> EnqueueOutcome:
    """Store one batch: the work itself, which does not know it runs in Lambda."""
    return service().enqueue(records_from_kafka_event(event))


def report(outcome: EnqueueOutcome) -> None:
    metrics.add_metric(name="DelayRecordsReceived", unit=MetricUnit.Count, value=outcome.received)
    metrics.add_metric(name="DelayMessagesEnqueued", unit=MetricUnit.Count, value=outcome.enqueued)
    metrics.add_metric(name="DelayDuplicatesIgnored", unit=MetricUnit.Count, value=outcome.duplicates)
    metrics.add_metric(name="DelayFiredImmediately", unit=MetricUnit.Count, value=outcome.fired_immediately)
    metrics.add_metric(name="DelayRecordsDropped", unit=MetricUnit.Count, value=len(outcome.dropped))
    metrics.add_metric(name="DelayRecordsRetried", unit=MetricUnit.Count, value=len(outcome.failed))


lambda_handler = lambda_handler_for(
    enqueue,
    data_class=KafkaEvent,
    report=report,
    respond=lambda outcome: partial_batch_response(outcome.failed),
)
