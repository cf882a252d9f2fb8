"""What a call resolves to (``Response``), and the client's counters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from switchyard.rpc import protocol
from switchyard.rpc.amqp_decode import undecodable
from switchyard.rpc.errors import RemoteError


@dataclass(frozen=True, slots=True)
class Response:
    """A response: ``status`` is ``ok``, ``error`` (the worker failed) or a dead-letter reason."""

    status: str
    body: bytes
    correlation_id: str
    headers: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == protocol.Status.OK

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def raise_for_status(self) -> Response:
        if not self.ok:
            raise RemoteError(self.status, self.body)
        return self


def status_of(headers: Mapping[str, Any]) -> str:
    """A response's status: its ``x-status`` (``ok`` when a plain worker sets none), ``error`` when
    its headers could not be decoded (whatever they said is unknown, so it cannot read as ok)."""
    if undecodable(headers) is not None:
        return protocol.Status.ERROR
    value = headers.get(protocol.STATUS_HEADER, protocol.Status.OK)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass
class ClientStats:
    """Counters a caller or a benchmark can read; updated by the I/O thread only."""

    published: int = 0
    sent: int = 0  # requests without reply-to the broker has (``send``)
    responses: int = 0
    stale_responses: int = 0
    malformed_responses: int = 0
    timeouts: int = 0
    returned: int = 0
    nacked: int = 0
    resent: int = 0  # publishes again on a new connection, the last one lost with the call in flight
    interrupted: int = 0  # calls failed with CallInterruptedError: no connection before their deadline
