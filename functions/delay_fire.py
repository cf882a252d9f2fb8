"""Delay scheduler, ready and fire: on a schedule, loops until the invocation's time runs short.

Each readied message is published at its deadline minus the timing advance and deleted only after
the broker confirmed it.
"""

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent

from switchyard.core.observability import lambda_handler_for, metrics
from switchyard.delay.model import FireOutcome
from switchyard.delay.service import service


def report(outcome: FireOutcome) -> None:
    metrics.add_metric(name="DelayMessagesReadied", unit=MetricUnit.Count, value=outcome.readied)
    metrics.add_metric(name="DelayMessagesFired", unit=MetricUnit.Count, value=outcome.fired)
    metrics.add_metric(name="DelayMessagesGoneAtDelete", unit=MetricUnit.Count, value=outcome.gone_at_delete)
    metrics.add_metric(name="DelayPublishFailures", unit=MetricUnit.Count, value=outcome.publish_failures)
    metrics.add_metric(name="DelayMessagesParked", unit=MetricUnit.Count, value=outcome.parked)
    metrics.add_metric(name="DelayStoreErrors", unit=MetricUnit.Count, value=outcome.store_errors)
    metrics.add_metric(name="DelayMaxTimerLateness", unit=MetricUnit.Milliseconds, value=outcome.max_late_ms)
    if outcome.overdue >= 0:  # -1: Postgres could not count them
        metrics.add_metric(name="DelayMessagesOverdue", unit=MetricUnit.Count, value=outcome.overdue)


lambda_handler = lambda_handler_for(
    lambda _event, context: service().fire(context.get_remaining_time_in_millis),
    data_class=EventBridgeEvent,
    report=report,
)
