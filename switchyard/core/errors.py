"""The error tree. Driver errors (pika, psycopg, redis, boto3) are wrapped at the edge with ``from``."""

from __future__ import annotations


class SwitchyardError(Exception):
    """Base of every error Switchyard raises on purpose."""


class ConfigError(SwitchyardError):
    """A setting is missing or malformed; the message names the variable."""


class InvalidNameError(SwitchyardError, ValueError):
    """A pool name, key or topic cannot be turned into a safe resource name."""


class BrokerError(SwitchyardError):
    """The message broker refused or lost an operation."""


class BrokerUnavailableError(BrokerError):
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
    """The RabbitMQ management HTTP API answered with an error."""


class RpcError(SwitchyardError):
    """A keyed RPC call did not produce a usable response."""


class CallTimeoutError(RpcError, TimeoutError):
    """No response arrived within the call's timeout; the slot was freed."""


class UnroutableError(RpcError):
    """The broker returned the request (basic.return): nothing could route it."""


class PublishRejectedError(RpcError):
    """The broker nacked the request under publisher confirms: it was not stored."""


class ClientBusyError(RpcError):
    """Every slot of the client stayed taken until the caller's wait ran out."""


class ClientClosedError(RpcError):
    """The client was closed (or lost its connection) while the call was in flight."""


class RemoteError(RpcError):
    """A response whose status is not ``ok``: a worker error or a dead-letter reason."""

    def __init__(self, status: str, body: bytes) -> None:
        super().__init__(f"{status}: {body[:200].decode('utf-8', 'replace')}")
        self.status = status
        self.body = body

__all__ = [
    "BrokerError",
    "BrokerUnavailableError",
    "CallTimeoutError",
    "ClientBusyError",
    "ClientClosedError",
    "ConfigError",
    "DeadLetteringStrandedError",
    "InvalidNameError",
    "ManagementApiError",
    "PoolNotEmptyError",
    "PoolNotFoundError",
    "PublishRejectedError",
    "RemoteError",
    "RpcError",
    "SwitchyardError",
    "TopologyError",
    "UnroutableError",
]
