"""RPC pool reconciler: an EventBridge schedule (locally, the runtime's ticker, every second).

One pass of both control loops; the pool-wide reconciler lock keeps overlapping invocations
from running two passes at once. Queue depth per worker group goes out as a metric (Amazon MQ
4.x sends none per queue).
"""

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent

from switchyard.aws.services import control_plane
from switchyard.core.observability import emit_gauge, lambda_handler_for
from switchyard.rpc import metrics
from switchyard.rpc.control.reconciler import ReconcileOutcome


def reconcile(_event: EventBridgeEvent, _context: object) -> ReconcileOutcome:
    outcome = control_plane().reconcile()
    for group_id, depth in outcome.depths.items():
        emit_gauge(metrics.QUEUE_DEPTH, depth, metrics.WORKER_GROUP_DIMENSION, group_id)
    return outcome


lambda_handler = lambda_handler_for(reconcile, data_class=EventBridgeEvent,
                                    metric_prefix=metrics.RECONCILE_PREFIX)
