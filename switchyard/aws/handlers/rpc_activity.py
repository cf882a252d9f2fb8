"""RPC activity tracker: Amazon MQ event source on ``{pool}-activity``.

One state update per key per batch; activity keeps a group Active and re-binds an Unbound one.
"""

from switchyard.aws.services import control_plane
from switchyard.core.observability import lambda_handler_for
from switchyard.rpc import metrics
from switchyard.rpc.control.rmq_event import RmqEvent, messages_from_event

lambda_handler = lambda_handler_for(
    lambda event, _context: control_plane().track_activity(messages_from_event(event)),
    data_class=RmqEvent,
    metric_prefix=metrics.ACTIVITY_PREFIX,
)
