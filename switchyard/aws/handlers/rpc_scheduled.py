"""Scheduled calls into their pools: MSK event source on the delay scheduler's output topic
(ReportBatchItemFailures).

Each fired record that names a pool is published into that pool's request exchange under publisher
confirms; refused ones are parked with the reason; records without a pool are left alone. A record
whose publish or parking failed is named in the partial batch response: its partition comes again
from it (duplicates carry the same message id, nothing is lost).
"""

from aws_lambda_powertools.utilities.data_classes import KafkaEvent

from switchyard.aws.services import scheduled_relay
from switchyard.core.observability import lambda_handler_for
from switchyard.delay.msk import partial_batch_response, records_from_kafka_event
from switchyard.rpc import metrics
from switchyard.rpc.control.scheduled import ScheduledOutcome


def relay(event: KafkaEvent, _context: object) -> ScheduledOutcome:
    """Relay one batch: the work itself, which does not know it runs in Lambda."""
    return scheduled_relay().relay(records_from_kafka_event(event))


lambda_handler = lambda_handler_for(
    relay,
    data_class=KafkaEvent,
    metric_prefix=metrics.SCHEDULED_PREFIX,
    respond=lambda outcome: partial_batch_response(outcome.failed),
)
