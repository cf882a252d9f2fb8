"""RPC dead-letter responder: Amazon MQ event source on ``{pool}-dl``.

Answers each dead-lettered request with its ``x-first-death-reason``, moves poison requests to
``{pool}-poison``, and returns only once every publish is confirmed.
"""

from switchyard.aws.services import control_plane
from switchyard.core.observability import lambda_handler_for
from switchyard.rpc import metrics
from switchyard.rpc.control.rmq_event import RmqEvent, messages_from_event

lambda_handler = lambda_handler_for(
    lambda event, _context: control_plane().respond_dead_letters(messages_from_event(event)),
    data_class=RmqEvent,
    metric_prefix=metrics.DEAD_LETTER_PREFIX,
)
