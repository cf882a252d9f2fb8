"""The rpc part's errors, under the core's tree (``BrokerError`` and ``RpcError`` live in the core:
the delay scheduler raises broker errors too, and ``RemoteError``, which pending raises, is an
``RpcError``). Driver errors (pika, redis, boto3) are wrapped with ``from``.
"""

from __future__ import annotations

from switchyard.core.errors import BrokerError, BrokerUnavailableError, RpcError, SwitchyardError


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


class CallTimeoutError(RpcError, TimeoutError):
    """No response arrived within the call's timeout; the slot was freed."""


class UnroutableError(RpcError):
    """The broker returned the request (basic.return): nothing could route it."""


class PublishRejectedError(RpcError):
    """The broker nacked the request under publisher confirms: it was not stored."""


class ClientBusyError(RpcError):
    """Every slot of the client stayed taken until the caller's wait ran out."""


class ClientThreadError(RpcError):
    """A blocking call from the thread that drives the client (a done-callback): it would wait for
    a response only that thread can take in."""


class ClientClosedError(RpcError):
    """The client was closed while the call was in flight (a lost connection re-sends it instead)."""


class CallInterruptedError(RpcError, BrokerUnavailableError):
    """The connection died with the call in flight, and no new one could re-send it before the
    call's deadline. Retryable: whether a worker handled it is unknown (its answer, if any, went to
    the lost connection's reply queue), so a retry is at-least-once, as the client's own re-send."""


class DriverError(SwitchyardError):
    """A driver could not start, stop or inspect workers; the control loop retries on its next tick."""


class LockTimeoutError(SwitchyardError):
    """A per-key lock stayed taken too long; the caller fails so its batch is redelivered."""


__all__ = [
    "CallInterruptedError",
    "CallTimeoutError",
    "ClientBusyError",
    "ClientClosedError",
    "DeadLetteringStrandedError",
    "DriverError",
    "LockTimeoutError",
    "ManagementApiError",
    "PoolNotEmptyError",
    "PoolNotFoundError",
    "PublishRejectedError",
    "TopologyError",
    "UnroutableError",
]


class ScheduledCallError(SwitchyardError):
    """A fired record that names a pool but cannot be made into its call (``reason`` says how)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
