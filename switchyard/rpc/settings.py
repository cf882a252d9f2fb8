"""RPC settings from the environment (documented in the README's configuration table)."""

from __future__ import annotations

from dataclasses import dataclass, field

from switchyard.core.config import Connections, env_float, env_int, env_str
from switchyard.core.errors import ConfigError
from switchyard.rpc.protocol import QueueType

# A call's default timeout, and with it its request's expiration. 30 s locally (a subprocess worker
# starts in about a second); a deployment writes its own into the stack's configuration, long
# enough for a new key's first call to wait for a Fargate task (README, "A new key's first call").
CALL_TIMEOUT_ENV = "SWITCHYARD_CALL_TIMEOUT"


@dataclass(frozen=True)
class PoolPolicy:
    """How a pool's request queues behave; applied through management-API policies."""

    queue_type: QueueType = QueueType.QUORUM
    message_ttl_ms: int = 300_000
    delivery_limit: int = 5
    # Amazon MQ installs its own default policies; ours must sit above them.
    priority: int = 10

    def __post_init__(self) -> None:
        if self.message_ttl_ms <= 0:
            raise ConfigError("request message TTL must be a positive number of milliseconds")
        if self.delivery_limit < 1:
            raise ConfigError("delivery limit must be at least 1")

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
        )


@dataclass(frozen=True)
class RpcSettings:
    connections: Connections = field(default_factory=Connections)
    policy: PoolPolicy = field(default_factory=PoolPolicy)
    client_concurrency: int = 64
    call_timeout: float = 30.0
    worker_prefetch: int = 4
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
            activity_interval=env_float("SWITCHYARD_ACTIVITY_INTERVAL", d.activity_interval),
        )
