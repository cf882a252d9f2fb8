"""Keyed RPC over RabbitMQ (the keyed RPC and slotted client designs).

Rooms: ``client/`` (the slotted client), ``worker/`` (the worker runtime and the demo handlers),
``control/`` (the control plane's handlers, the reconciler, the pool's topology and broker access),
``drivers/`` (how worker groups are started). At the top: the wire ``protocol``, the ``amqp``
connection helpers all three share, and the part's shape: ``settings``, ``errors``, ``ports``,
``store`` (pool state and locks in Redis), ``metrics`` and ``service`` (one pool's control plane,
wired once per process).
"""

from switchyard.rpc.client import AsyncRpcClient, Response, RpcClient
from switchyard.rpc.control.topology import PoolTopology, init_pool
from switchyard.rpc.protocol import Event, QueueType, Status
from switchyard.rpc.settings import PoolPolicy, RpcSettings
from switchyard.rpc.worker import Request, Requeue, Worker, WorkerConfig

__all__ = [
    "AsyncRpcClient",
    "Event",
    "PoolPolicy",
    "PoolTopology",
    "QueueType",
    "Request",
    "Requeue",
    "Response",
    "RpcClient",
    "RpcSettings",
    "Status",
    "Worker",
    "WorkerConfig",
    "init_pool",
]
