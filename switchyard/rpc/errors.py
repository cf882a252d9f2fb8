"""The rpc part's errors, all under its root ``RpcError`` (declared in the core, so spark catches
it through its port); a call that failed is a ``CallError``. ``BrokerError``,
``BrokerUnavailableError`` and ``RemoteError`` are the part's own of the core's roles of those
names (docs/errors.md). Driver errors (pika, redis, boto3) are wrapped with ``from``.
"""

from __future__ import annotations

from switchyard.core import errors as core_errors
from switchyard.core.errors import RpcError


class CallError(RpcError):
    """A keyed RPC call did not produce a usable response."""


class RemoteError(CallError, core_errors.RemoteError):
    """A response whose status is not ``ok``: a worker error or a dead-letter reason."""


class BrokerError(RpcError, core_errors.BrokerError):
    """The broker refused or lost an operation of the part (a publish, a declare, a collect)."""


class BrokerUnavailableError(BrokerError, core_errors.BrokerUnavailableError):
    """The broker could not be reached (connection refused, closed, timed out)."""


class TopologyError(BrokerError):
    """Exchanges, queues or policies are missing or declared differently than Switchyard expects."""


class PoolNotFoundError(TopologyError):
    """The pool was never initialized: its request exchange does not exist."""


class PoolNotEmptyError(TopologyError):
    """A pool delete was refused: its queues still hold messages (``--force`` drops them)."""

    def __init__(self, pool: str, waiting: dict[str, int]) -> None:
        total = sum(waiting.values())
        queues = ", ".join(f"{q} ({n})" for q, n in sorted(waiting.items()))
        super().__init__(f"pool {pool!r} still holds {total} messages in {queues}; nothing deleted "
                         "(add --force to drop them)")
        self.waiting = waiting


class DeadLetteringStrandedError(TopologyError):
    """The broker can start no quorum queue with at-least-once dead-lettering (rabbitmq-server#16652).

    Its dead-letter worker supervisor stopped; only a node restart brings it back. Raised with the
    recovery step, since the broker itself answers only ``INTERNAL_ERROR``.
    """


class ManagementApiError(BrokerError):
    """The RabbitMQ management HTTP API answered with an error (``status``; ``body``, whole: the
    message keeps the first 300 characters)."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class CallTimeoutError(CallError, TimeoutError):
    """No response arrived within the call's timeout; the slot was freed."""


class UnroutableError(CallError):
    """The broker returned the request (basic.return): nothing could route it."""


class PublishRejectedError(CallError):
    """The broker nacked the request under publisher confirms: it was not stored."""


class ClientBusyError(CallError):
    """Every slot of the client stayed taken until the caller's wait ran out."""


class ClientThreadError(CallError):
    """A blocking call from the thread that drives the client (a done-callback): it would wait for
    a response only that thread can take in."""


class ClientClosedError(CallError):
    """The client was closed while the call was in flight (a lost connection re-sends it instead)."""


class CallInterruptedError(CallError, BrokerUnavailableError):
    """The connection died with the call in flight, and no new one could re-send it before the
    call's deadline. Retryable: whether a worker handled it is unknown (its answer, if any, went to
    the lost connection's reply queue), so a retry is at-least-once, as the client's own re-send."""


class DriverError(RpcError):
    """A driver could not start, stop or inspect workers; the control loop retries on its next tick."""


class LockTimeoutError(RpcError):
    """A per-key lock stayed taken too long; the caller fails so its batch is redelivered."""




class ScheduledCallError(RpcError):
    """A fired record that names a pool but cannot be made into its call (``reason`` says how)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


__all__ = [
    "BrokerError",
    "BrokerUnavailableError",
    "CallError",
    "CallInterruptedError",
    "CallTimeoutError",
    "ClientBusyError",
    "ClientClosedError",
    "ClientThreadError",
    "DeadLetteringStrandedError",
    "DriverError",
    "LockTimeoutError",
    "ManagementApiError",
    "PoolNotEmptyError",
    "PoolNotFoundError",
    "PublishRejectedError",
    "RemoteError",
    "RpcError",
    "ScheduledCallError",
    "TopologyError",
    "UnroutableError",
]
