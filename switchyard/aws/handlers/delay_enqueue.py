"""Delay scheduler, consume and enqueue: MSK event source on the input topic (ReportBatchItemFailures).

Returns only after the batch is persisted, so the mapping commits offsets only for stored (or
confirmed-fired) records. Bad records are dropped (logged, counted) and never fail the batch; a
record that could not be stored for a transient reason is named in the partial batch response, so
the mapping delivers its partition again from it; an unreachable Postgres fails the whole batch.
"""

from aws_lambda_powertools.utilities.data_classes import KafkaEvent

from switchyard.aws.services import delay
from switchyard.core.observability import lambda_handler_for
from switchyard.delay.metrics import report_enqueue
from switchyard.delay.model import EnqueueOutcome
from switchyard.delay.msk import partial_batch_response, records_from_kafka_event


def enqueue(event: KafkaEvent, _context: object) -> EnqueueOutcome:
    """Store one batch: the work itself, which does not know it runs in Lambda."""
    return delay().enqueue(records_from_kafka_event(event))


lambda_handler = lambda_handler_for(
    enqueue,
    data_class=KafkaEvent,
    report=report_enqueue,
    respond=lambda outcome: partial_batch_response(outcome.failed),
)
