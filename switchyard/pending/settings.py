"""Pending request queue settings: Halibut's timeouts and rates by default, each one configurable.

Every ``SWITCHYARD_PENDING_*`` variable is in docs/configuration.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields

from switchyard.core.config import Connections, env_float, env_int, env_str
from switchyard.core.errors import ConfigError

# API Gateway (REST) ends every integration at 29 s; a long poll must answer before that.
API_GATEWAY_LIMIT_S = 29.0
# An endpoint name becomes part of a Redis Cluster hash tag and a URL path segment.
ENDPOINT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")


def check_endpoint(endpoint: str) -> str:
    """The endpoint name, or ValueError: it becomes a hash tag ({...}) and a URL path segment."""
    if not isinstance(endpoint, str) or not ENDPOINT_NAME.match(endpoint):
        raise ValueError(f"endpoint must match {ENDPOINT_NAME.pattern} (letters, digits, . _ : -), "
                         f"got {endpoint!r}")
    return endpoint



def token_sources() -> tuple[str, str]:
    """Where the node API's endpoint tokens come from: the Secrets Manager secret
    ``SWITCHYARD_PENDING_TOKENS_SECRET_ARN`` (on AWS) and ``SWITCHYARD_PENDING_TOKENS`` (a JSON
    object, locally); "" for one not set."""
    return env_str("SWITCHYARD_PENDING_TOKENS_SECRET_ARN", ""), env_str("SWITCHYARD_PENDING_TOKENS", "")


@dataclass(frozen=True)
class PendingSettings:
    """Timeouts in seconds. Defaults are Halibut's values."""

    prefix: str = "swpq"
    pickup_timeout_s: float = 120.0  # a request nobody took by then is taken back
    request_ttl_extra_s: float = 120.0  # a queued request's TTL = its pickup timeout + this (Halibut)
    response_ttl_s: float = 1200.0
    pending_list_ttl_s: float = 86400.0
    heartbeat_interval_s: float = 15.0
    # The fast-RPC shortcut: no heartbeat, pickup check or response poll before this; a call that
    # finishes sooner costs four Redis commands in all.
    heartbeat_initial_delay_s: float = 7.0
    sender_timeout_s: float = 90.0  # caller silent this long: the processor's work is cancelled
    processor_timeout_s: float = 60.0  # processor silent this long: the caller gets an error
    poll_wait_s: float = 30.0  # an empty dequeue returns after this (the keep-alive poll)
    http_poll_wait_s: float = 25.0  # the same over HTTP: must end inside API Gateway's 29 s
    data_loss_check_s: float = 60.0
    data_loss_guard_ttl_s: float = 8 * 3600.0
    retry_window_s: float = 30.0  # every Redis command is retried this long ...
    retry_interval_s: float = 1.0  # ... this far apart
    max_message_bytes: int = 1024 * 1024  # request/response JSON; larger data goes in streams
    redis_connections: int = 128  # per node, for scripts (a poller's blocking pops use its own)
    # Long polls of one endpoint that may wait at once (all nodes together); more get 429, so one
    # endpoint's pollers cannot hold every server thread (or, on AWS, the function's concurrency).
    max_polls_per_endpoint: int = 32
    store: str = ""  # where streams go: "" (none), a directory path, or s3://bucket/prefix
    connections: Connections = field(default_factory=Connections)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s") and (not isinstance(value, int | float) or value <= 0):
                raise ConfigError(f"pending setting {f.name} must be a positive number of seconds")
        if self.http_poll_wait_s >= API_GATEWAY_LIMIT_S - 1:
            raise ConfigError(f"SWITCHYARD_PENDING_HTTP_POLL_WAIT must be under {API_GATEWAY_LIMIT_S - 1:g} "
                              "s (API Gateway ends a request at 29 s)")
        if self.heartbeat_interval_s >= min(self.sender_timeout_s, self.processor_timeout_s):
            raise ConfigError("the heartbeat interval must be shorter than both heartbeat timeouts")
        if self.max_polls_per_endpoint < 1:
            raise ConfigError("SWITCHYARD_PENDING_MAX_POLLS must be at least 1")
        if self.redis_connections < 4:
            raise ConfigError("SWITCHYARD_PENDING_REDIS_CONNECTIONS must be at least 4")
        if self.max_message_bytes < 1024:
            raise ConfigError("SWITCHYARD_PENDING_MAX_MESSAGE_BYTES must be at least 1024")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", self.prefix):
            raise ConfigError(f"SWITCHYARD_PENDING_PREFIX must be 1-40 of A-Za-z0-9_.-, got {self.prefix!r}")

    @property
    def in_flight_ttl_s(self) -> float:
        """TTL of a taken request's state, refreshed by every heartbeat."""
        return max(self.sender_timeout_s, self.processor_timeout_s) + 120.0

    @property
    def retries(self) -> int:
        return math.ceil(self.retry_window_s / self.retry_interval_s)

    @classmethod
    def from_env(cls) -> PendingSettings:
        d = cls()
        names = {
            "prefix": "PREFIX", "pickup_timeout_s": "PICKUP_TIMEOUT",
            "request_ttl_extra_s": "REQUEST_TTL_EXTRA",
            "response_ttl_s": "RESPONSE_TTL", "pending_list_ttl_s": "LIST_TTL",
            "heartbeat_interval_s": "HEARTBEAT_INTERVAL",
            "heartbeat_initial_delay_s": "HEARTBEAT_INITIAL_DELAY",
            "sender_timeout_s": "SENDER_TIMEOUT", "processor_timeout_s": "PROCESSOR_TIMEOUT",
            "poll_wait_s": "POLL_WAIT", "http_poll_wait_s": "HTTP_POLL_WAIT",
            "data_loss_check_s": "DATA_LOSS_CHECK", "data_loss_guard_ttl_s": "DATA_LOSS_GUARD_TTL",
            "retry_window_s": "RETRY_WINDOW", "retry_interval_s": "RETRY_INTERVAL",
            "max_message_bytes": "MAX_MESSAGE_BYTES", "redis_connections": "REDIS_CONNECTIONS",
            "max_polls_per_endpoint": "MAX_POLLS",
            "store": "STORE",
        }
        values: dict[str, object] = {}
        for attr, suffix in names.items():
            default = getattr(d, attr)
            var = f"SWITCHYARD_PENDING_{suffix}"
            if isinstance(default, str):
                values[attr] = env_str(var, default)
            elif isinstance(default, int):
                values[attr] = env_int(var, default)
            else:
                values[attr] = env_float(var, default)
        return cls(connections=Connections.from_env(), **values)  # type: ignore[arg-type]
