"""Event bus housekeeping on an EventBridge schedule (every minute): promote due jobs, scrub dead
workers' jobs, autodrop under memory pressure, telemetry. The workers run the same jobs every few
seconds; this keeps telemetry and autodrop going while no worker is up."""

import functools

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent

from switchyard.bus.housekeeping import HousekeepingOutcome, housekeep
from switchyard.bus.metrics import HOUSEKEEPING_PREFIX
from switchyard.bus.service import BusService
from switchyard.core.observability import lambda_handler_for


@functools.cache
def bus() -> BusService:
    """This environment's bus, made on the first run."""
    return BusService.from_env()


def run(_event: EventBridgeEvent, _context: object) -> HousekeepingOutcome:
    return housekeep(bus().store)


lambda_handler = lambda_handler_for(run, data_class=EventBridgeEvent, metric_prefix=HOUSEKEEPING_PREFIX)
