"""Kept importable for applications that catch Switchyard's errors by their first path.

The error tree lives in ``switchyard.core.errors`` (the root and the errors several parts raise)
and in each part's ``errors`` module; this module re-exports the names applications catch.
"""

from switchyard.core.errors import *  # noqa: F403
from switchyard.core.errors import __all__ as _core_all
from switchyard.rpc.errors import (
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

__all__ = [*_core_all, "CallInterruptedError", "CallTimeoutError", "ClientBusyError", "ClientClosedError",
           "DeadLetteringStrandedError", "ManagementApiError", "PoolNotEmptyError", "PoolNotFoundError",
           "PublishRejectedError", "TopologyError", "UnroutableError"]
