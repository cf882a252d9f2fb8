"""Keyed RPC over RabbitMQ (seeds 000 and 001)."""

from switchyard.rpc.client import Response, RpcClient
from switchyard.rpc.control.topology import PoolTopology, init_pool
from switchyard.rpc.protocol import Event, QueueType, Status
from switchyard.rpc.settings import PoolPolicy, RpcSettings
from switchyard.rpc.worker import Request, Requeue, Worker, WorkerConfig

__all__ = [
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
