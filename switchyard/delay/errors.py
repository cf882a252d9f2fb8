"""Errors of the delay scheduler, under the project's SwitchyardError tree.

Driver errors (psycopg, confluent-kafka) are wrapped at the adapters with ``from`` so the core
and the handlers only ever see these.
"""

from __future__ import annotations

from switchyard.core.errors import BrokerError, BrokerUnavailableError, SwitchyardError


class DelayError(SwitchyardError):
    """Base of the delay scheduler's errors."""


class InvalidMessageError(DelayError, ValueError):
    """An input record lacks a Chronos header or carries a malformed one (it is dropped, not retried)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class StoreError(DelayError):
    """The delay store (Postgres) refused an operation (cause unknown: neither retried nor dropped)."""


class TransientStoreError(StoreError):
    """The operation failed for a reason that passes (deadlock, lock or statement timeout, overload)."""


class StoreUnavailableError(TransientStoreError):
    """Postgres could not be reached or dropped the connection; the operation may be retried."""


class UnstorableMessageError(StoreError):
    """Postgres refused a message's own data (a data or integrity error): a retry would fail the same way."""


class PublishError(BrokerError, DelayError):
    """The output broker refused or did not confirm a message."""


class MessageRefusedError(PublishError):
    """This very message cannot be published, ever (too large, an invalid record): it is parked."""


class PublisherUnavailableError(BrokerUnavailableError, PublishError):
    """The output broker could not be reached in time."""
