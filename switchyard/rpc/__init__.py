"""Keyed RPC over RabbitMQ (the keyed RPC and slotted client designs).

Rooms: ``client/`` (the slotted client), ``worker/`` (the worker runtime and the demo handlers),
``control/`` (the control plane's handlers, the reconciler, the pool's topology and broker access),
``drivers/`` (how worker groups are started). At the top: the wire ``protocol``, the ``amqp``
connection helpers all three share, and the part's shape: ``settings``, ``errors``, ``ports``,
``store`` (pool state and locks in Redis), ``metrics`` and ``service`` (one pool's control plane,
wired once per process).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from switchyard.rpc.client import AsyncRpcClient, Response, RpcClient
    from switchyard.rpc.control.topology import PoolTopology, init_pool
    from switchyard.rpc.protocol import Event, QueueType, Status
    from switchyard.rpc.settings import PoolPolicy, RpcSettings
    from switchyard.rpc.worker import Request, Requeue, Worker, WorkerConfig

# Imported on first use (PEP 562): a worker imports ``switchyard.rpc.worker`` and must not pay
# for the client, its I/O loop and the control plane's topology (about 200 ms of a cold start).
_FACES = {
    "AsyncRpcClient": "switchyard.rpc.client", "Response": "switchyard.rpc.client",
    "RpcClient": "switchyard.rpc.client",
    "PoolTopology": "switchyard.rpc.control.topology", "init_pool": "switchyard.rpc.control.topology",
    "Event": "switchyard.rpc.protocol", "QueueType": "switchyard.rpc.protocol",
    "Status": "switchyard.rpc.protocol", "PoolPolicy": "switchyard.rpc.settings",
    "RpcSettings": "switchyard.rpc.settings", "Request": "switchyard.rpc.worker",
    "Requeue": "switchyard.rpc.worker", "Worker": "switchyard.rpc.worker",
    "WorkerConfig": "switchyard.rpc.worker",
}

__all__ = ["AsyncRpcClient", "Event", "PoolPolicy", "PoolTopology", "QueueType", "Request", "Requeue",
           "Response", "RpcClient", "RpcSettings", "Status", "Worker", "WorkerConfig", "init_pool"]


def __getattr__(name: str) -> Any:
    if name not in _FACES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_FACES[name]), name)
    globals()[name] = value
    return value
