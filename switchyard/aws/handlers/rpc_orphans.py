"""RPC orphan handler: Amazon MQ event source on ``{pool}-orphan``.

Returns only when every orphan of the batch is forwarded and confirmed; raising makes the
mapping redeliver the whole batch (duplicates are possible, losses are not).
"""

from switchyard.aws.services import control_plane
from switchyard.core.observability import lambda_handler_for
from switchyard.rpc import metrics
from switchyard.rpc.control.rmq_event import RmqEvent, messages_from_event

lambda_handler = lambda_handler_for(
    lambda event, _context: control_plane().forward_orphans(messages_from_event(event)),
    data_class=RmqEvent,
    metric_prefix=metrics.ORPHAN_PREFIX,
)
