"""The rpc part's settings from the environment (documented in docs/configuration.md).

The client's and worker's (``RpcSettings``, ``PoolPolicy``), the control plane's (``ControlSettings``)
and the worker group driver's (``DriverSettings``, and the ECS driver's ``ecs_settings_from_env``).
The worker protocol's own ``WORKER_*`` variables are read by ``worker.WorkerConfig``.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from switchyard.core.config import Connections, env_float, env_int, env_str
from switchyard.core.errors import ConfigError
from switchyard.rpc import protocol as p
from switchyard.rpc.protocol import QueueType

if TYPE_CHECKING:
    from switchyard.rpc.drivers.ecs import EcsSettings

# A call's default timeout, and with it its request's expiration. 30 s locally (a subprocess worker
# starts in about a second); a deployment writes its own into the stack's configuration, long
# enough for a new key's first call to wait for a Fargate task (docs/deployment.md, "A new key's first call").
CALL_TIMEOUT_ENV = "SWITCHYARD_CALL_TIMEOUT"
# Every AMQP connection of the part (client, worker, control plane) heartbeats this often.
HEARTBEAT_ENV = "SWITCHYARD_AMQP_HEARTBEAT"
DEFAULT_HEARTBEAT_S = 30


def heartbeat_from_env() -> int:
    """Seconds between AMQP heartbeats; the broker drops a connection silent for two of them."""
    heartbeat = env_int(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S)
    if heartbeat < 0:
        raise ConfigError(f"{HEARTBEAT_ENV} must be >= 0 (0 disables heartbeats), got {heartbeat}")
    return heartbeat


@dataclass(frozen=True)
class PoolPolicy:
    """How a pool's request queues behave; applied through management-API policies."""

    queue_type: QueueType = QueueType.QUORUM
    message_ttl_ms: int = 300_000
    delivery_limit: int = 5
    # Amazon MQ installs its own default policies; ours must sit above them.
    priority: int = 10
    # Members of each new quorum queue (the broker takes as many nodes as it has, up to this): one per
    # node of Amazon MQ's three-node cluster. Said here, not left to the broker's own configuration.
    initial_group_size: int = 3

    def __post_init__(self) -> None:
        if self.message_ttl_ms <= 0:
            raise ConfigError("request message TTL must be a positive number of milliseconds")
        if self.delivery_limit < 1:
            raise ConfigError("delivery limit must be at least 1")
        if self.initial_group_size < 1:
            raise ConfigError("SWITCHYARD_QUORUM_INITIAL_GROUP_SIZE must be at least 1")

    @classmethod
    def from_env(cls) -> PoolPolicy:
        d = cls()
        raw_type = env_str("SWITCHYARD_QUEUE_TYPE", d.queue_type.value)
        try:
            queue_type = QueueType(raw_type)
        except ValueError as exc:
            raise ConfigError(f"SWITCHYARD_QUEUE_TYPE must be quorum or classic, got {raw_type!r}") from exc
        return cls(
            queue_type=queue_type,
            message_ttl_ms=env_int("SWITCHYARD_REQUEST_TTL_MS", d.message_ttl_ms),
            delivery_limit=env_int("SWITCHYARD_DELIVERY_LIMIT", d.delivery_limit),
            priority=env_int("SWITCHYARD_POLICY_PRIORITY", d.priority),
            initial_group_size=env_int("SWITCHYARD_QUORUM_INITIAL_GROUP_SIZE", d.initial_group_size),
        )


@dataclass(frozen=True)
class RpcSettings:
    connections: Connections = field(default_factory=Connections)
    policy: PoolPolicy = field(default_factory=PoolPolicy)
    client_concurrency: int = 64
    call_timeout: float = 30.0
    worker_prefetch: int = 4
    worker_ack_delay_ms: float = 5.0
    activity_interval: float = 1.0

    @classmethod
    def from_env(cls) -> RpcSettings:
        d = cls()
        return cls(
            connections=Connections.from_env(),
            policy=PoolPolicy.from_env(),
            client_concurrency=env_int("SWITCHYARD_CLIENT_CONCURRENCY", d.client_concurrency),
            call_timeout=env_float(CALL_TIMEOUT_ENV, d.call_timeout),
            worker_prefetch=env_int("SWITCHYARD_WORKER_PREFETCH", d.worker_prefetch),
            worker_ack_delay_ms=env_float("SWITCHYARD_WORKER_ACK_DELAY_MS", d.worker_ack_delay_ms),
            activity_interval=env_float("SWITCHYARD_ACTIVITY_INTERVAL", d.activity_interval),
        )


@dataclass(frozen=True)
class Delays:
    unbind_s: float = 300.0
    stop_s: float = 600.0
    # How long a stopped group's tombstone is kept: activity reports later than this (from
    # workers nobody stopped, e.g. started by hand) count as a new group again.
    tombstone_s: float = 3600.0


@dataclass(frozen=True)
class ControlSettings:
    pool: str
    delays: Delays
    reconcile_interval_s: float = 1.0
    # How often (across every pool on the broker) the reconciler probes at-least-once dead-lettering;
    # under the alarm's five-minute period, so each period sees a probe. 0: never.
    dead_letter_probe_interval_s: float = 240.0
    # Where the probe runs on AWS: its own vhost, as its own user (the secret's ARN), so no per-pool
    # user needs the policymaker tag (switchyard/rpc/control/access.py). Empty: this plane's own.
    dead_letter_probe_vhost: str = ""
    dead_letter_probe_secret_arn: str = ""

    def probe_settings(self, settings: RpcSettings) -> RpcSettings | None:
        """``settings`` for the dead-lettering probe, or None if it runs with the plane's own."""
        if not (self.dead_letter_probe_vhost and self.dead_letter_probe_secret_arn):
            return None
        connections = settings.connections.as_amqp_user(self.dead_letter_probe_vhost,
                                                        self.dead_letter_probe_secret_arn)
        return replace(settings, connections=connections)

    @classmethod
    def from_env(cls, pool: str | None = None) -> ControlSettings:
        pool = pool or env_str("SWITCHYARD_POOL", "")
        if not pool:
            raise ConfigError("SWITCHYARD_POOL must name the pool this control plane manages")
        d = Delays()
        return cls(
            pool=p.validate_pool(pool),
            delays=Delays(unbind_s=env_float("SWITCHYARD_UNBIND_DELAY", d.unbind_s),
                          stop_s=env_float("SWITCHYARD_STOP_DELAY", d.stop_s),
                          tombstone_s=env_float("SWITCHYARD_TOMBSTONE_TTL", d.tombstone_s)),
            reconcile_interval_s=env_float("SWITCHYARD_RECONCILE_INTERVAL", 1.0),
            dead_letter_probe_interval_s=env_float("SWITCHYARD_DEAD_LETTER_PROBE_INTERVAL", 240.0),
            dead_letter_probe_vhost=env_str("SWITCHYARD_DEAD_LETTER_PROBE_VHOST", ""),
            dead_letter_probe_secret_arn=env_str("SWITCHYARD_DEAD_LETTER_PROBE_SECRET_ARN", ""),
        )


DEFAULT_HANDLER = "switchyard.rpc.examples:describe"
DRIVERS = ("subprocess", "noop", "ecs")
DEFAULT_WORKER_LOG_DIR = ".local/logs/workers"


@dataclass(frozen=True)
class DriverSettings:
    """The driver's settings, read once from the environment (see the module docstring)."""

    driver: str = "subprocess"
    command: tuple[str, ...] = ()
    min_workers: int = 1
    max_workers: int = 4
    target_backlog: int = 10
    log_dir: str = DEFAULT_WORKER_LOG_DIR
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


def _env_list(name: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in env_str(name, "").split(",") if part.strip())


def ecs_settings_from_env() -> EcsSettings:
    """The ECS driver's settings (``SWITCHYARD_ECS_*``; see ``switchyard.rpc.drivers``)."""
    from switchyard.rpc.drivers.ecs import (
        DEFAULT_CAPACITY_PROVIDER,
        DEFAULT_CONTAINER,
        DEFAULT_TASK_DEFINITION,
        EcsSettings,
    )

    return EcsSettings(
        cluster=env_str("SWITCHYARD_ECS_CLUSTER", ""),
        subnets=_env_list("SWITCHYARD_ECS_SUBNETS"),
        security_groups=_env_list("SWITCHYARD_ECS_SECURITY_GROUPS"),
        task_definition=env_str("SWITCHYARD_ECS_TASK_DEFINITION", DEFAULT_TASK_DEFINITION),
        container=env_str("SWITCHYARD_ECS_CONTAINER", DEFAULT_CONTAINER),
        capacity_provider=env_str("SWITCHYARD_ECS_CAPACITY_PROVIDER", DEFAULT_CAPACITY_PROVIDER),
    )
