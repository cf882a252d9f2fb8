"""What the core needs from the outside world: a store (Postgres) and a publisher (the output topic).

The core (enqueue, fire, sweep) only sees these protocols; ``store`` and ``publisher`` are the adapters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Generic, Protocol, TypeVar

from switchyard.delay.model import DelayedMessage, Header, LatenessWindow, ReadyMessage, StuckMessage


class DelayStore(Protocol):
    """Persistent delayed messages (the seed's single table)."""

    def existing_ids(self, ids: Sequence[str]) -> set[str]: ...

    def insert(self, messages: Sequence[DelayedMessage]) -> set[str]:
        """Insert in one transaction; returns the ids inserted (others were already stored)."""
        ...

    def ready(self, node_id: str, horizon: timedelta, limit: int) -> list[ReadyMessage]: ...

    def next_deadline(self) -> datetime | None:
        """The earliest deadline still waiting (None when none): how long an idle node may sleep."""
        ...

    def overdue(self, before: datetime) -> int:
        """Waiting rows no node claimed although they were due before ``before`` (the backlog)."""
        ...

    def wait_enqueued(self, timeout_s: float) -> float | None:
        """Block up to ``timeout_s`` for new work; the earliest deadline enqueued meanwhile (epoch s)."""
        ...

    def stop_listening(self) -> None: ...

    def delete(self, messages: Sequence[ReadyMessage]) -> set[str]:
        """Delete fired rows; returns the ids deleted (the rest were already gone)."""
        ...

    def release(self, node_id: str, messages: Sequence[ReadyMessage]) -> set[str]: ...

    def park(self, node_id: str, refused: Sequence[tuple[ReadyMessage, str]]) -> set[str]:
        """Set aside rows the broker refused for good (with the reason); returns the ids moved."""
        ...

    def record_lateness(self, node_id: str, window: LatenessWindow) -> None:
        """Keep how late a fire loop published in one window (for the status view)."""
        ...

    def find_stuck(self, hold: timedelta, limit: int) -> list[StuckMessage]: ...

    def reset_stuck(self, stuck: Sequence[StuckMessage]) -> list[StuckMessage]: ...


Token = TypeVar("Token")  # what a sender passes with a message, handed back with its Delivery


@dataclass(frozen=True)
class Delivery(Generic[Token]):
    """The broker's answer for one sent message: ``error`` is None when delivery was confirmed.

    ``refused``: the broker (or the client, before sending) rejected this very message for good (too
    large, an invalid record); sending it again cannot succeed, unlike a timeout or an outage.
    """

    token: Token
    error: str | None
    refused: bool = False


class Publisher(Protocol[Token]):
    """Asynchronous publishing with explicit confirmations (nothing counts until delivered); each
    Delivery carries the token its message was sent with (the fire loop's row, enqueue's id)."""

    def send(
        self, key: bytes | None, value: bytes | None, headers: Sequence[Header], token: Token
    ) -> None: ...

    def poll(self, timeout_s: float) -> list[Delivery[Token]]:
        """Wait up to ``timeout_s`` for confirmations; return those that arrived since the last call."""
        ...

    def in_flight(self) -> int: ...

    def flush(self, timeout_s: float) -> list[Delivery[Token]]:
        """Wait up to ``timeout_s`` for every outstanding confirmation and return them."""
        ...
