"""The root of the error tree, the errors the core raises, and the roles several parts play.

Each part has one root (``RpcError``, ``DelayError``, ``PendingError``, ``BusError``,
``SparkError``) and keeps its errors in its ``errors`` module; docs/errors.md has the table. A role
more than one part plays (its store refused, its store is out of reach, the other side failed) is
a class here, and each part declares its own under the same name, from its root and the role: so
``except switchyard.bus.errors.StoreUnavailableError`` is the bus's, and
``except switchyard.errors.StoreUnavailableError`` any part's. Driver errors (pika, psycopg,
redis, boto3) are wrapped at the edge with ``from``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping


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


class StoreError(SwitchyardError):
    """Role: a part's store (Postgres, Redis, S3) refused an operation."""


class StoreUnavailableError(StoreError):
    """Role: a part's store could not be reached in time; the operation may be retried."""


class RemoteError(SwitchyardError):
    """Role: the other side answered with an error (a worker's, a polling service's, a dead-letter
    reason); ``status`` says which, ``body`` is its answer."""

    def __init__(self, status: str, body: bytes) -> None:
        super().__init__(f"{status}: {body[:200].decode('utf-8', 'replace')}")
        self.status = status
        self.body = body


class RpcError(SwitchyardError):
    """Base of the rpc part's errors (``switchyard.rpc.errors``; a failed call is its ``CallError``).

    The one part root declared here, not in its part: ``switchyard.core.errors.RpcError`` keeps
    importing as before, and the core cannot alias a part's class (no import points up a floor)."""


def deprecated_aliases(module: str, renamed: Mapping[str, type[BaseException]]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` that answers the old names of renamed errors with a
    ``DeprecationWarning`` (kept for one version: CHANGELOG.md lists them)."""

    def __getattr__(name: str) -> object:
        new = renamed.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is deprecated: use {new.__module__}.{new.__qualname__}",
                      DeprecationWarning, stacklevel=2)
        return new

    return __getattr__


__all__ = [
    "BrokerError",
    "BrokerUnavailableError",
    "ConfigError",
    "InvalidNameError",
    "MalformedEventError",
    "RemoteError",
    "RpcError",
    "StoreError",
    "StoreUnavailableError",
    "SwitchyardError",
]
