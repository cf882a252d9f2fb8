"""Pending request queue, node API: the Lambda behind API Gateway (REST) that polling services long-poll.

The same Powertools resolver ``switchyard pending serve`` runs locally; this execution environment
is one node (its pub/sub listener wakes long polls). Importing reads nothing and opens no
connection: the node is built and started on the first invocation (``switchyard.aws.services``),
so a cold start's init phase, and the layer import check, never wait on SSM or Redis. Tokens per
endpoint come from the Secrets Manager secret ``SWITCHYARD_PENDING_TOKENS_SECRET_ARN``; Redis is the
deployment's ElastiCache.
"""

from typing import Any

from switchyard.aws.services import pending_node
from switchyard.core.observability import joins_traces, logger, metrics, tracer


@metrics.log_metrics
@tracer.capture_lambda_handler
@joins_traces  # the W3C traces of its requests, annotated on the X-Ray segment
@logger.inject_lambda_context(correlation_id_path="requestContext.requestId")
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    queue, app = pending_node()
    queue.start()  # once per environment; later calls return at once
    return app.resolve(event, context)
