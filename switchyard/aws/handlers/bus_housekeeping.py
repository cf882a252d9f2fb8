"""Event bus housekeeping on an EventBridge schedule (every minute): promote due jobs, scrub dead
workers' jobs, autodrop under memory pressure, telemetry. The workers run the same jobs every few
seconds; this keeps telemetry and autodrop going while no worker is up."""

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent

from switchyard.aws.services import bus
from switchyard.bus.housekeeping import HousekeepingOutcome, housekeep
from switchyard.bus.metrics import HOUSEKEEPING_PREFIX
from switchyard.core.observability import lambda_handler_for


def run(_event: EventBridgeEvent, _context: object) -> HousekeepingOutcome:
    return housekeep(bus().store)


lambda_handler = lambda_handler_for(run, data_class=EventBridgeEvent, metric_prefix=HOUSEKEEPING_PREFIX)
