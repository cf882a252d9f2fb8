"""Delay scheduler, ready and fire: on a schedule, loops until the invocation's time runs short.

Each readied message is published at its deadline minus the timing advance and deleted only after
the broker confirmed it.
"""

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent

from switchyard.aws.services import delay
from switchyard.core.observability import lambda_handler_for
from switchyard.delay.metrics import report_fire

lambda_handler = lambda_handler_for(
    lambda _event, context: delay().fire(context.get_remaining_time_in_millis),
    data_class=EventBridgeEvent,
    report=report_fire,
)
