"""Why a pending-queue call did not return a response: each cause its own error, with a clear message."""

from __future__ import annotations

from switchyard.core.errors import RemoteError, SwitchyardError

# ``RemoteError`` (the polling service answered with an error) is the core's, raised with status
# "request <id>: the service failed" and the service's error as its body: one class for every
# part's "the other side failed", re-exported here so ``switchyard.pending.errors.RemoteError``
# still imports. (It is an ``RpcError``, no longer a ``PendingError``.)


class PendingError(SwitchyardError):
    """Base of the pending request queue's errors."""


class PickupTimeoutError(PendingError):
    """No polling service took the request within the pickup timeout; it was taken back."""


class ProcessorLostError(PendingError):
    """The node processing the request stopped heartbeating; it is presumed offline."""


class DataLossError(PendingError):
    """Redis lost its data (the data-loss guard vanished) while the request was in flight."""


class CancelledError(PendingError):
    """The caller cancelled the request (before or after pickup)."""


class QueueUnavailableError(PendingError):
    """Redis could not be reached within the retry window."""


class MessageTooLargeError(PendingError, ValueError):
    """A request or response is larger than the limit; large data belongs in streams."""


class StreamError(PendingError):
    """A stream could not be stored or read back intact."""


__all__ = [
    "CancelledError",
    "DataLossError",
    "MessageTooLargeError",
    "PendingError",
    "PickupTimeoutError",
    "ProcessorLostError",
    "QueueUnavailableError",
    "RemoteError",
    "StreamError",
]
