"""The pending queue's figures per endpoint, for people: ``switchyard pending status``,
``switchyard status`` and the console read them here."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from switchyard.pending.service import PendingQueue


@dataclass(frozen=True)
class EndpointStatus:
    endpoint: str
    waiting: int  # in the endpoint's queue, not taken by a polling service yet
    queued: int  # requests in state queued (waiting, or between queue and pickup)
    taken: int  # picked up, not answered
    answered: int  # answered, the response not yet read by its caller
    oldest_age_s: float  # the oldest request's time in its state


@dataclass(frozen=True)
class PendingStatus:
    endpoints: tuple[EndpointStatus, ...]  # by name

    def to_dict(self) -> dict[str, Any]:
        """``{"endpoints": [{endpoint, waiting, queued, taken, answered, oldest_age_s}]}``: a name is
        a value, never a key (an endpoint may be named like any word of the document)."""
        return asdict(self)


def pending_status(queue: PendingQueue) -> PendingStatus:
    """Read every endpoint's figures (a SCAN of the queue's keys: an admin view, not a hot path)."""
    return PendingStatus(tuple(EndpointStatus(name, **figures) for name, figures in queue.status().items()))
