"""Worker group drivers: how the worker groups control loop starts, stops and sizes workers.

``switchyard.rpc.ports`` holds the contract, one module per backend (``subprocess``, ``noop``, ``ecs``), and
``driver_from_env()`` picks one from the environment:

* ``SWITCHYARD_DRIVER``: ``subprocess`` (default), ``noop`` or ``ecs``;
* ``SWITCHYARD_WORKER_HANDLER``: ``module:function`` (default ``switchyard.rpc.examples:describe``);
* ``SWITCHYARD_WORKER_COMMAND``: the whole command, shell-split (default
  ``<sys.executable> -m switchyard worker --handler <SWITCHYARD_WORKER_HANDLER>``);
* ``SWITCHYARD_MIN_WORKERS`` (1), ``SWITCHYARD_MAX_WORKERS`` (4), ``SWITCHYARD_TARGET_BACKLOG``
  (10 waiting requests per worker);
* ``SWITCHYARD_WORKER_LOG_DIR`` (``.local/logs/workers``), ``SWITCHYARD_WORKER_STOP_TIMEOUT``
  (15 s between SIGTERM and SIGKILL).
* ECS (``ecs.py``): ``SWITCHYARD_ECS_CLUSTER``, ``SWITCHYARD_ECS_SUBNETS`` and
  ``SWITCHYARD_ECS_SECURITY_GROUPS`` (comma-separated), ``SWITCHYARD_ECS_TASK_DEFINITION``
  (``switchyard-worker-{pool}``), ``SWITCHYARD_ECS_CONTAINER`` (``worker``),
  ``SWITCHYARD_ECS_CAPACITY_PROVIDER`` (``FARGATE`` or ``FARGATE_SPOT``; default ``FARGATE``); the
  group lock lives in ``SWITCHYARD_REDIS_URL``.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

from switchyard.core.config import env_float, env_int, env_str
from switchyard.core.errors import ConfigError
from switchyard.rpc.drivers.noop import NoopDriver
from switchyard.rpc.drivers.subprocess import DEFAULT_LOG_DIR, SubprocessDriver, WorkerProcess
from switchyard.rpc.errors import DriverError
from switchyard.rpc.ports import WorkerGroup, WorkerGroupDriver, desired_workers

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

DEFAULT_HANDLER = "switchyard.rpc.examples:describe"
DRIVERS = ("subprocess", "noop", "ecs")


@dataclass(frozen=True)
class DriverSettings:
    """The driver's settings, read once from the environment (see the module docstring)."""

    driver: str = "subprocess"
    command: tuple[str, ...] = ()
    min_workers: int = 1
    max_workers: int = 4
    target_backlog: int = 10
    log_dir: str = str(DEFAULT_LOG_DIR)
    stop_timeout: float = 15.0

    @classmethod
    def from_env(cls) -> DriverSettings:
        d = cls()
        driver = env_str("SWITCHYARD_DRIVER", d.driver)
        if driver not in DRIVERS:
            raise ConfigError(f"SWITCHYARD_DRIVER must be one of {', '.join(DRIVERS)}, got {driver!r}")
        handler = env_str("SWITCHYARD_WORKER_HANDLER", DEFAULT_HANDLER)
        raw_command = env_str("SWITCHYARD_WORKER_COMMAND", "")
        try:
            command = tuple(shlex.split(raw_command)) if raw_command else (
                sys.executable, "-m", "switchyard", "worker", "--handler", handler)
        except ValueError as exc:
            raise ConfigError(f"SWITCHYARD_WORKER_COMMAND cannot be split: {exc}") from exc
        return cls(
            driver=driver,
            command=command,
            min_workers=env_int("SWITCHYARD_MIN_WORKERS", d.min_workers),
            max_workers=env_int("SWITCHYARD_MAX_WORKERS", d.max_workers),
            target_backlog=env_int("SWITCHYARD_TARGET_BACKLOG", d.target_backlog),
            log_dir=env_str("SWITCHYARD_WORKER_LOG_DIR", d.log_dir),
            stop_timeout=env_float("SWITCHYARD_WORKER_STOP_TIMEOUT", d.stop_timeout),
        )


def driver_from_env(settings: DriverSettings | None = None) -> WorkerGroupDriver:
    """The driver ``SWITCHYARD_DRIVER`` names, configured from the environment."""
    settings = settings or DriverSettings.from_env()
    if settings.driver == "noop":
        return NoopDriver()
    if settings.driver == "ecs":
        return _ecs_driver_from_env(settings)
    return SubprocessDriver(
        settings.command,
        min_workers=settings.min_workers,
        max_workers=settings.max_workers,
        target_backlog=settings.target_backlog,
        log_dir=settings.log_dir,
        stop_timeout=settings.stop_timeout,
    )


def _env_list(name: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in env_str(name, "").split(",") if part.strip())


def _ecs_driver_from_env(settings: DriverSettings) -> WorkerGroupDriver:
    """The ECS driver (imported here: only the deployment needs boto3's ECS client)."""
    from switchyard.core.config import Connections
    from switchyard.rpc.drivers.ecs import (
        DEFAULT_CAPACITY_PROVIDER,
        DEFAULT_CONTAINER,
        DEFAULT_TASK_DEFINITION,
        EcsDriver,
        EcsSettings,
        ecs_client,
    )
    from switchyard.rpc.store import WorkerGroupLock

    connections = Connections.from_env()
    ecs = EcsSettings(
        cluster=env_str("SWITCHYARD_ECS_CLUSTER", ""),
        subnets=_env_list("SWITCHYARD_ECS_SUBNETS"),
        security_groups=_env_list("SWITCHYARD_ECS_SECURITY_GROUPS"),
        task_definition=env_str("SWITCHYARD_ECS_TASK_DEFINITION", DEFAULT_TASK_DEFINITION),
        container=env_str("SWITCHYARD_ECS_CONTAINER", DEFAULT_CONTAINER),
        capacity_provider=env_str("SWITCHYARD_ECS_CAPACITY_PROVIDER", DEFAULT_CAPACITY_PROVIDER),
    )
    return EcsDriver(
        ecs,
        lock=WorkerGroupLock.from_url(connections.redis_url, ecs.lock_ttl_s, ecs.lock_wait_s),
        client=ecs_client(connections.aws_endpoint_url),
        min_workers=settings.min_workers,
        max_workers=settings.max_workers,
        target_backlog=settings.target_backlog,
    )
