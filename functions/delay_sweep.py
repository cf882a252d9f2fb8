"""Delay scheduler, failure detection and recovery: on a schedule, sweeps every detection interval.

Rows readied longer ago than the hold time are reset (compare-and-set) and the suspected node logged.
"""

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent

from switchyard.core.observability import lambda_handler_for, metrics
from switchyard.delay.model import SweepOutcome
from switchyard.delay.service import service


def report(outcome: SweepOutcome) -> None:
    metrics.add_metric(name="DelaySuspectedFailures", unit=MetricUnit.Count, value=outcome.reset)
    metrics.add_metric(name="DelayStoreErrors", unit=MetricUnit.Count, value=outcome.store_errors)


lambda_handler = lambda_handler_for(
    lambda _event, context: service().sweep(context.get_remaining_time_in_millis),
    data_class=EventBridgeEvent,
    report=report,
)
