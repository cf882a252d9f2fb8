"""Why a pending-queue call did not return a response: each cause its own error, with a clear
message, all under the part's root ``PendingError``."""

from __future__ import annotations

from switchyard.core import errors as core_errors
from switchyard.core.errors import SwitchyardError, deprecated_aliases


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


class StoreUnavailableError(PendingError, core_errors.StoreUnavailableError):
    """Redis could not be reached within the retry window."""


class RemoteError(PendingError, core_errors.RemoteError):
    """The polling service answered with an error: status "request <id>: the service failed", its
    error the body (the core's ``RemoteError`` role, as the rpc part's worker errors)."""


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
    "RemoteError",
    "StoreUnavailableError",
    "StreamError",
]

# The name before the error tree had one name per role (CHANGELOG.md), for one version.
__getattr__ = deprecated_aliases(__name__, {"QueueUnavailableError": StoreUnavailableError})
