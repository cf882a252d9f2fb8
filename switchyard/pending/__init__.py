"""The pending request queue (Halibut's design): RPC from any node to polling services, through Redis."""

from switchyard.pending.errors import (
    CancelledError,
    DataLossError,
    MessageTooLargeError,
    PendingError,
    PickupTimeoutError,
    ProcessorLostError,
    QueueUnavailableError,
    RemoteError,
)
from switchyard.pending.model import CancelToken, Delivery, PendingRequest, ProcessorBeat, Reply, Response
from switchyard.pending.service import PendingQueue
from switchyard.pending.settings import PendingSettings

__all__ = [
    "CancelToken",
    "CancelledError",
    "DataLossError",
    "Delivery",
    "MessageTooLargeError",
    "PendingError",
    "PendingQueue",
    "PendingRequest",
    "PendingSettings",
    "PickupTimeoutError",
    "ProcessorBeat",
    "ProcessorLostError",
    "QueueUnavailableError",
    "RemoteError",
    "Reply",
    "Response",
]
