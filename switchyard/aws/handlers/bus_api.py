"""Event bus API: API Gateway (REST, proxy integration) -> this function -> the one Powertools
resolver of ``switchyard.bus.api`` (through ``BusApp.resolve``): Routemaster's endpoints, validated,
with an OpenAPI document. The app is built once per execution environment, on its first request
(importing reads no setting and no secret): ``switchyard.aws.services.bus_app``."""

from typing import Any

from switchyard.aws.services import bus_app
from switchyard.core.observability import joins_traces, logger, metrics, tracer


@metrics.log_metrics  # BusEventsPublished, flushed once per invocation
@tracer.capture_lambda_handler
@joins_traces  # the W3C traces of its requests, annotated on the X-Ray segment
@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return bus_app().resolve(event, context)
