"""The pending request queue (Halibut's design): RPC from any node to polling services, through Redis."""

from switchyard.core.errors import deprecated_aliases
from switchyard.pending.errors import (
    CancelledError,
    DataLossError,
    MessageTooLargeError,
    PendingError,
    PickupTimeoutError,
    ProcessorLostError,
    RemoteError,
    StoreUnavailableError,
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
    "RemoteError",
    "Reply",
    "Response",
    "StoreUnavailableError",
]

# The name before the error tree had one name per role (CHANGELOG.md), for one version.
__getattr__ = deprecated_aliases(__name__, {"QueueUnavailableError": StoreUnavailableError})
