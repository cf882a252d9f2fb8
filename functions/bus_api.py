"""Event bus API: API Gateway (REST, proxy integration) -> this function -> the one Powertools
resolver of ``switchyard.bus.api`` (through ``handle``): Routemaster's endpoints, validated, with an
OpenAPI document."""

from typing import Any

from switchyard.bus.api import handle
from switchyard.core.observability import logger, metrics, tracer


@metrics.log_metrics  # BusEventsPublished, flushed once per invocation
@tracer.capture_lambda_handler
@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return handle(event, context)
