"""RPC pool reconciler: an EventBridge schedule (locally, the runtime's ticker, every second).

One pass of both control loops; the pool-wide reconciler lock keeps overlapping invocations
from running two passes at once.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from switchyard.observability import emit_counts, emit_gauge, logger, metrics
from switchyard.rpc.control_plane import control_plane

tracer = Tracer()


@metrics.log_metrics
@tracer.capture_lambda_handler
@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    outcome = control_plane().reconcile()
    emit_counts(outcome, prefix="Reconcile")
    for group_id, depth in outcome.depths.items():
        emit_gauge("QueueDepth", depth, "WorkerGroup", group_id)
    return asdict(outcome)
