"""The root of the error tree and the errors more than one part raises.

Each part keeps its own errors in its ``errors`` module (``switchyard.rpc.errors``, ...). Driver
errors (pika, psycopg, redis, boto3) are wrapped at the edge with ``from``.
"""

from __future__ import annotations


class SwitchyardError(Exception):
    """Base of every error Switchyard raises on purpose."""


class ConfigError(SwitchyardError):
    """A setting is missing or malformed; the message names the variable."""


class InvalidNameError(SwitchyardError, ValueError):
    """A pool name, key or topic cannot be turned into a safe resource name."""


class MalformedEventError(SwitchyardError, ValueError):
    """A Lambda event without the shape its event source mapping sends (a hand-made one)."""


class BrokerError(SwitchyardError):
    """The message broker refused or lost an operation."""


class BrokerUnavailableError(BrokerError):
    """The broker could not be reached (connection refused, closed, timed out)."""


class RpcError(SwitchyardError):
    """A keyed RPC call did not produce a usable response (here: ``RemoteError`` derives from it)."""


class RemoteError(RpcError):
    """A response whose status is not ``ok``: a worker error or a dead-letter reason."""

    def __init__(self, status: str, body: bytes) -> None:
        super().__init__(f"{status}: {body[:200].decode('utf-8', 'replace')}")
        self.status = status
        self.body = body

__all__ = [
    "BrokerError",
    "BrokerUnavailableError",
    "ConfigError",
    "InvalidNameError",
    "RemoteError",
    "RpcError",
    "SwitchyardError",
]
