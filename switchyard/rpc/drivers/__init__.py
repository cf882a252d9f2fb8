"""Worker group drivers: how the worker groups control loop starts, stops and sizes workers.

``switchyard.rpc.ports`` holds the contract, one module per backend (``subprocess``, ``noop``, ``ecs``), and
``driver_from_env()`` picks one from the environment (read by ``switchyard.rpc.settings``:
``DriverSettings``; ``ecs.EcsSettings.from_env`` for the ECS driver):

* ``SWITCHYARD_RPC_DRIVER``: ``subprocess`` (default), ``noop`` or ``ecs``;
* ``SWITCHYARD_RPC_WORKER_HANDLER``: ``module:function``, required (``switchyard local`` defaults it to
  ``switchyard.rpc.examples:describe``);
* ``SWITCHYARD_RPC_WORKER_COMMAND``: the whole command, shell-split (default
  ``<sys.executable> -m switchyard.rpc.worker --handler <SWITCHYARD_RPC_WORKER_HANDLER>``: the lean
  entry point, not the whole command line);
* ``SWITCHYARD_RPC_MIN_WORKERS`` (1), ``SWITCHYARD_RPC_MAX_WORKERS`` (4), ``SWITCHYARD_RPC_TARGET_BACKLOG``
  (10 waiting requests per worker), ``SWITCHYARD_RPC_MIN_SPARES`` (0: warm spare workers);
* ``SWITCHYARD_RPC_WORKER_LOG_DIR`` (``.local/logs/workers``), ``SWITCHYARD_RPC_WORKER_STOP_TIMEOUT_S``
  (15 s between SIGTERM and SIGKILL).
* ECS (``ecs.py``): ``SWITCHYARD_RPC_ECS_CLUSTER``, ``SWITCHYARD_RPC_ECS_SUBNETS`` and
  ``SWITCHYARD_RPC_ECS_SECURITY_GROUPS`` (comma-separated), ``SWITCHYARD_RPC_ECS_TASK_DEFINITION``
  (``switchyard-worker-{pool}``), ``SWITCHYARD_RPC_ECS_CONTAINER`` (``worker``),
  ``SWITCHYARD_RPC_ECS_CAPACITY_PROVIDER`` (``FARGATE`` or ``FARGATE_SPOT``; default ``FARGATE``),
  ``SWITCHYARD_RPC_ECS_MAX_TASKS`` (0: no cap on the pool's tasks before a spare starts); the
  group lock lives in ``SWITCHYARD_REDIS_URL``.
"""

from __future__ import annotations

from switchyard.core.errors import ConfigError
from switchyard.rpc.drivers.noop import NoopDriver
from switchyard.rpc.drivers.subprocess import SubprocessDriver, WorkerProcess
from switchyard.rpc.errors import DriverError
from switchyard.rpc.ports import WorkerGroup, WorkerGroupDriver, desired_workers
from switchyard.rpc.settings import MIN_SPARES, POOL, DriverSettings
from switchyard.rpc.spares import SpareRegistry

__all__ = [
    "DriverError",
    "DriverSettings",
    "NoopDriver",
    "SubprocessDriver",
    "WorkerGroup",
    "WorkerGroupDriver",
    "WorkerProcess",
    "desired_workers",
    "driver_from_env",
]


def driver_from_env(settings: DriverSettings | None = None, pool: str = "") -> WorkerGroupDriver:
    """The driver ``SWITCHYARD_RPC_DRIVER`` names, configured from the environment (``pool``: whose
    spares it keeps, default ``SWITCHYARD_RPC_POOL``; needed only with ``SWITCHYARD_RPC_MIN_SPARES``)."""
    settings = settings or DriverSettings.from_env()
    if settings.driver == "noop":
        return NoopDriver()
    if settings.driver == "ecs":
        return _ecs_driver_from_env(settings, pool)
    return SubprocessDriver(
        settings.command,
        min_workers=settings.min_workers,
        max_workers=settings.max_workers,
        target_backlog=settings.target_backlog,
        log_dir=settings.log_dir,
        stop_timeout=settings.stop_timeout,
        min_spares=settings.min_spares,
        spares=_spare_registry(pool) if settings.min_spares else None,
    )


def _spare_registry(pool: str) -> SpareRegistry:
    """The pool's spare registry, on ``SWITCHYARD_REDIS_URL`` as the pool state is."""
    from switchyard.core.config import Connections
    from switchyard.core.redis_client import connect_redis

    pool = pool or POOL.read()
    if not pool:
        raise ConfigError(f"{MIN_SPARES.name} needs the pool whose spares to keep: set {POOL.name}")
    return SpareRegistry(connect_redis(Connections.from_env()), pool)


def _ecs_driver_from_env(settings: DriverSettings, pool: str) -> WorkerGroupDriver:
    """The ECS driver (imported here: only the deployment needs boto3's ECS client)."""
    from switchyard.core.config import Connections
    from switchyard.rpc.drivers.ecs import EcsDriver, EcsSettings, ecs_client
    from switchyard.rpc.store import WorkerGroupLock

    connections = Connections.from_env()
    ecs = EcsSettings.from_env()
    return EcsDriver(
        ecs,
        lock=WorkerGroupLock.from_connections(connections, ecs.lock_ttl_s, ecs.lock_wait_s),
        client=ecs_client(connections.aws_endpoint_url),
        min_workers=settings.min_workers,
        max_workers=settings.max_workers,
        target_backlog=settings.target_backlog,
        min_spares=settings.min_spares,
        spares=_spare_registry(pool) if settings.min_spares else None,
    )
