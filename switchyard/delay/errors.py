"""Errors of the delay scheduler, all under its root ``DelayError``. ``StoreError``,
``StoreUnavailableError``, ``BrokerError`` and ``BrokerUnavailableError`` are the part's own of the
core's roles of those names (docs/errors.md).

Driver errors (psycopg, confluent-kafka) are wrapped at the adapters with ``from`` so the core
and the handlers only ever see these.
"""

from __future__ import annotations

from switchyard.core import errors as core_errors
from switchyard.core.errors import SwitchyardError, deprecated_aliases


class DelayError(SwitchyardError):
    """Base of the delay scheduler's errors."""


class InvalidMessageError(DelayError, ValueError):
    """An input record lacks a Chronos header or carries a malformed one (it is dropped, not retried)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class StoreError(DelayError, core_errors.StoreError):
    """The delay store (Postgres) refused an operation (cause unknown: neither retried nor dropped)."""


class TransientStoreError(StoreError):
    """The operation failed for a reason that passes (deadlock, lock or statement timeout, overload)."""


class StoreUnavailableError(TransientStoreError, core_errors.StoreUnavailableError):
    """Postgres could not be reached or dropped the connection; the operation may be retried."""


class UnstorableMessageError(StoreError):
    """Postgres refused a message's own data (a data or integrity error): a retry would fail the same way."""


class BrokerError(DelayError, core_errors.BrokerError):
    """The output broker refused or did not confirm a message."""


class MessageRefusedError(BrokerError):
    """This very message cannot be published, ever (too large, an invalid record): it is parked."""


class BrokerUnavailableError(BrokerError, core_errors.BrokerUnavailableError):
    """The output broker could not be reached in time."""


# The names before the error tree had one name per role (CHANGELOG.md), for one version.
__getattr__ = deprecated_aliases(__name__, {"PublishError": BrokerError,
                                            "PublisherUnavailableError": BrokerUnavailableError})
