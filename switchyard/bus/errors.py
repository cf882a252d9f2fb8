"""Why a bus call failed: each cause its own error, under the bus's root ``BusError``. The HTTP API maps
them to Routemaster's status codes (in ``routes``); Redis errors are wrapped at the store, ``from``
the driver's, so nothing above the store catches a ``redis`` exception."""

from __future__ import annotations

from switchyard.core import errors as core_errors
from switchyard.core.errors import SwitchyardError, deprecated_aliases


class BusError(SwitchyardError):
    """Base of the event bus's errors."""


class TopicClaimedError(BusError):
    """Another publisher owns the topic (403)."""


class UnknownTokenError(BusError):
    """The token is not registered (401)."""


class TopicLimitError(BusError):
    """A subscription would create more unclaimed topics than the client may have (403)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a client may have created at most {limit} unclaimed topics by subscribing "
                         "(they count until a publisher claims them or they are deleted)")
        self.limit = limit


class UnauthorizedError(BusError):
    """No valid credential of the kind the endpoint needs (401)."""

    def __init__(self, kinds: tuple[str, ...]) -> None:
        super().__init__(", or ".join(f"a {kind} token" for kind in kinds))


class BadInputError(BusError):
    """A request the API refuses with this message (400, once the caller is authenticated)."""


class StoreError(BusError, core_errors.StoreError):
    """Redis refused a command (a script error, OOM, WRONGTYPE): the API answers 503."""


class StoreUnavailableError(StoreError, core_errors.StoreUnavailableError):
    """Redis could not be reached in time: a worker keeps its job and waits for Redis."""


class UnknownJobError(BusError, ValueError):
    """A job queue or housekeeping job name the bus does not have."""


class CallbackError(BusError):
    """A delivery could not be made: the address was refused, the deadline passed, the answer broke."""


class CallbackRefusedError(CallbackError, ValueError):
    """The callback URL or an address it resolves to is not one the bus may call (a ValueError, so
    the API's validation answers 400 with the message)."""


# The names before the error tree had one name per role (CHANGELOG.md), for one version.
__getattr__ = deprecated_aliases(__name__, {"StorageError": StoreError,
                                            "StorageUnavailableError": StoreUnavailableError})
