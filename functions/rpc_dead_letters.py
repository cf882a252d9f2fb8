"""RPC dead-letter responder: Amazon MQ event source on ``{pool}-dl``.

Answers each dead-lettered request with its ``x-first-death-reason``, moves poison requests to
``{pool}-poison``, and returns only once every publish is confirmed.
"""

from aws_lambda_powertools.utilities.data_classes.rabbit_mq_event import RabbitMQEvent

from switchyard.core.observability import lambda_handler_for
from switchyard.rpc.control_plane import control_plane
from switchyard.rpc.rmq_event import messages_from_event

lambda_handler = lambda_handler_for(
    lambda event, _context: control_plane().respond_dead_letters(messages_from_event(event)),
    data_class=RabbitMQEvent,
    metric_prefix="DeadLetter",
)
