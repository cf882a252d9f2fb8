"""Delay scheduler, failure detection and recovery: on a schedule, sweeps every detection interval.

Rows readied longer ago than the hold time are reset (compare-and-set) and the suspected node logged.
"""

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent

from switchyard.aws.services import delay
from switchyard.core.observability import lambda_handler_for
from switchyard.delay.metrics import report_sweep

lambda_handler = lambda_handler_for(
    lambda _event, context: delay().sweep(context.get_remaining_time_in_millis),
    data_class=EventBridgeEvent,
    report=report_sweep,
)
