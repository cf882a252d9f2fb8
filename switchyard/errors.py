"""Kept importable for applications that catch Switchyard's errors by their first path.

The error tree lives in ``switchyard.core.errors`` (the root, the core's errors and the roles
several parts play) and in each part's ``errors`` module (docs/errors.md); this module re-exports
the names applications catch: a role's class here (``StoreUnavailableError``, ``RemoteError``...)
catches every part's.
"""

from switchyard.core.errors import *  # noqa: F403
from switchyard.core.errors import __all__ as _core_all
from switchyard.rpc.errors import (
    CallError,
    CallInterruptedError,
    CallTimeoutError,
    ClientBusyError,
    ClientClosedError,
    DeadLetteringStrandedError,
    ManagementApiError,
    PoolNotEmptyError,
    PoolNotFoundError,
    PublishRejectedError,
    TopologyError,
    UnroutableError,
)

__all__ = [*_core_all, "CallError", "CallInterruptedError", "CallTimeoutError", "ClientBusyError",
           "ClientClosedError", "DeadLetteringStrandedError", "ManagementApiError", "PoolNotEmptyError",
           "PoolNotFoundError", "PublishRejectedError", "TopologyError", "UnroutableError"]
