"""Why a pending-queue call did not return a response: each cause its own error, with a clear message."""

from __future__ import annotations

from switchyard.core.errors import SwitchyardError


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


class RemoteError(PendingError):
    """The polling service answered with an error."""


class QueueUnavailableError(PendingError):
    """Redis could not be reached within the retry window."""


class MessageTooLargeError(PendingError, ValueError):
    """A request or response is larger than the limit; large data belongs in streams."""
