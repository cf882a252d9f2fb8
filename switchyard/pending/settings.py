"""Pending request queue settings: Halibut's timeouts and rates by default, each one configurable.

Every ``SWITCHYARD_PENDING_*`` variable is in docs/configuration.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from switchyard.core.config import Connections, Setting, build, config_source
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



def _pending(name: str, default: object, doc: str, unit: str = "", **more: Any) -> Setting[Any]:
    """A pending setting: ``SWITCHYARD_PENDING_<NAME>[_S]``; a duration's old name had no unit."""
    if unit == "s":
        more["old"] = (f"SWITCHYARD_PENDING_{name}",)
        name += "_S"
    return Setting(f"SWITCHYARD_PENDING_{name}", default, doc, unit=unit, **more)


TOKENS = _pending("TOKENS", "", "polling services' tokens, a JSON object `{\"endpoint\": \"token\"}`")
TOKENS_SECRET_ARN = _pending("TOKENS_SECRET_ARN", "", "the Secrets Manager secret holding those tokens "
                             "(re-read every 5 min)")


def token_sources(source: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Where the node API's endpoint tokens come from: the Secrets Manager secret ``TOKENS_SECRET_ARN``
    (on AWS) and ``TOKENS`` (a JSON object, locally); "" for one not set."""
    source = config_source() if source is None else source
    return TOKENS_SECRET_ARN.read(source), TOKENS.read(source)


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
            raise ConfigError(f"{PENDING['http_poll_wait_s'].name} must be under {API_GATEWAY_LIMIT_S - 1:g} "
                              "s (API Gateway ends a request at 29 s)")
        if self.heartbeat_interval_s >= min(self.sender_timeout_s, self.processor_timeout_s):
            raise ConfigError("the heartbeat interval must be shorter than both heartbeat timeouts")
        if self.max_polls_per_endpoint < 1:
            raise ConfigError(f"{PENDING['max_polls_per_endpoint'].name} must be at least 1")
        if self.redis_connections < 4:
            raise ConfigError(f"{PENDING['redis_connections'].name} must be at least 4")
        if self.max_message_bytes < 1024:
            raise ConfigError(f"{PENDING['max_message_bytes'].name} must be at least 1024")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", self.prefix):
            raise ConfigError(f"{PENDING['prefix'].name} must be 1-40 of A-Za-z0-9_.-, got {self.prefix!r}")

    @property
    def in_flight_ttl_s(self) -> float:
        """TTL of a taken request's state, refreshed by every heartbeat."""
        return max(self.sender_timeout_s, self.processor_timeout_s) + 120.0

    @property
    def retries(self) -> int:
        return math.ceil(self.retry_window_s / self.retry_interval_s)

    @classmethod
    def from_env(cls, source: Mapping[str, str] | None = None) -> PendingSettings:
        source = config_source() if source is None else source
        return build(cls, PENDING, source, connections=Connections.from_env(source))


# field -> (the variable's name after SWITCHYARD_PENDING_, unit, doc); defaults are the fields'.
_FIELDS: dict[str, tuple[str, str, str]] = {
    "prefix": ("PREFIX", "",
        "pending queue key prefix: keys are `<prefix>:{<endpoint>}:*` (one cluster slot per endpoint)"),
    "pickup_timeout_s": ("PICKUP_TIMEOUT", "s",
        "seconds a request may wait for a polling service before it is taken back"),
    "request_ttl_extra_s": ("REQUEST_TTL_EXTRA", "s",
        "seconds added to the pickup timeout for a request's TTL"),
    "response_ttl_s": ("RESPONSE_TTL", "s", "seconds a stored response lives"),
    "pending_list_ttl_s": ("LIST_TTL", "s",
        "seconds an endpoint's pending list lives (refreshed on every push)"),
    "heartbeat_interval_s": ("HEARTBEAT_INTERVAL", "s", "seconds between heartbeats"),
    "heartbeat_initial_delay_s": ("HEARTBEAT_INITIAL_DELAY", "s",
        "seconds before the first heartbeat (calls that finish sooner send none)"),
    "sender_timeout_s": ("SENDER_TIMEOUT", "s",
        "seconds without heartbeats after which the caller is presumed gone"),
    "processor_timeout_s": ("PROCESSOR_TIMEOUT", "s",
        "seconds without heartbeats after which the processor is presumed gone"),
    "poll_wait_s": ("POLL_WAIT", "s", "seconds an empty dequeue waits"),
    "http_poll_wait_s": ("HTTP_POLL_WAIT", "s",
        "seconds an empty HTTP long poll waits (must stay under 28: API Gateway ends at 29)"),
    "data_loss_check_s": ("DATA_LOSS_CHECK", "s", "seconds between data-loss checks"),
    "data_loss_guard_ttl_s": ("DATA_LOSS_GUARD_TTL", "s", "seconds the data-loss guard key lives"),
    "retry_window_s": ("RETRY_WINDOW", "s", "seconds every Redis command is retried (redis-py `Retry`)"),
    "retry_interval_s": ("RETRY_INTERVAL", "s", "seconds between those retries"),
    "max_message_bytes": ("MAX_MESSAGE_BYTES", "bytes",
        "largest request/response JSON; larger data goes in streams"),
    "redis_connections": ("REDIS_CONNECTIONS", "",
        "Redis connections per node for scripts (a thread waits for a free one); each polling thread "
        "holds one more for its blocking pops"),
    "max_polls_per_endpoint": ("MAX_POLLS", "",
        "long polls of one endpoint that may wait at once, all nodes together (counted in Redis); more "
        "are answered 429 with `Retry-After`"),
    "store": ("STORE", "", "where streams go: a directory or `s3://bucket/prefix`"),
}
PENDING: dict[str, Setting[Any]] = {
    field: _pending(name, getattr(PendingSettings, field), doc, unit)
    for field, (name, unit, doc) in _FIELDS.items()
}
