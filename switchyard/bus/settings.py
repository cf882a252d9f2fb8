"""Settings of the event bus: Routemaster's knobs under ``SWITCHYARD_BUS_*`` names.

Every value is read and checked here once, so a bad setting fails at start-up, not in a delivery.
docs/configuration.md lists each variable; keep the two in step.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property

from switchyard.bus.callbacks import Allowlist
from switchyard.core.config import env_int, fields_from_env, prefixed
from switchyard.core.errors import ConfigError

_BUS_NAME_RE = re.compile(r"^[a-z0-9_-]{1,64}$")


def root_key_from_env() -> str:
    """The root key: ``SWITCHYARD_BUS_ROOT_KEY``, else the ``root_key`` field of the JSON secret
    named by ``SWITCHYARD_BUS_SECRET_ARN`` (AWS: Lambda has no secret injection). "" disables root."""
    key = os.environ.get("SWITCHYARD_BUS_ROOT_KEY", "")
    if key or not os.environ.get("SWITCHYARD_BUS_SECRET_ARN"):
        return key
    from switchyard.core.aws_secrets import _secret_values

    return _secret_values("BUS", os.environ).get("root_key", "")


@dataclass(frozen=True)
class BusSettings:
    """One bus. Durations in milliseconds and sizes in bytes, as in Routemaster's ``.env``."""

    name: str = "main"  # the Redis hash tag: every key of one bus lives in one cluster slot
    root_key: str = ""
    allow_http_callbacks: bool = False  # local runs and tests only: http:// to loopback addresses
    callback_allow: str = ""  # internal destinations callbacks may reach: host[:port] or networks
    max_event_data: int = 1024  # bytes of compact JSON of an event's ``data``
    worker_threads: int = 4
    acquire_timeout_s: float = 1.0
    connect_timeout_s: float = 2.0
    delivery_timeout_s: float = 20.0  # wall clock for a whole delivery: connect, send, the answer
    max_response_bytes: int = 4096  # of a callback's answer read; the rest is never read
    max_threads: int = 16  # delivery threads of one worker when slow deliveries hold the usual ones
    host_threads: int = 2  # deliveries to one callback host and port in flight at once, per worker
    max_backoff_ms: int = 60_000
    heal_rate: int = 1
    damage_rate: int = 2
    scrub_after_ms: int = 30_000  # a worker unseen this long has its pending jobs put back
    heartbeat_ms: int = 2_000
    schedule_interval_ms: int = 100
    autodrop_interval_ms: int = 10_000
    monitor_interval_ms: int = 10_000
    scrub_interval_ms: int = 10_000
    max_mem: int = 100_000_000
    min_free: int = 10_000_000
    job_error_retry_ms: int = 5_000  # an unexpected exception in a job retries it this much later
    # Topics a client may create by subscribing (unclaimed until a publisher claims them), and how
    # old one without subscribers must be before housekeeping removes it: GET /topics stays bounded.
    max_unclaimed_topics: int = 100
    unclaimed_topic_ttl_ms: int = 3_600_000

    def __post_init__(self) -> None:
        if not _BUS_NAME_RE.match(self.name):
            raise ConfigError(f"SWITCHYARD_BUS_NAME must match [a-z0-9_-]{{1,64}}, got {self.name!r}")
        for field, low in (("worker_threads", 1), ("max_event_data", 0), ("max_backoff_ms", 1),
                           ("max_response_bytes", 0), ("host_threads", 1),
                           ("max_threads", self.worker_threads),
                           ("heal_rate", 1), ("damage_rate", 1), ("scrub_after_ms", 1),
                           ("heartbeat_ms", 1), ("schedule_interval_ms", 1), ("min_free", 0),
                           ("max_unclaimed_topics", 0), ("unclaimed_topic_ttl_ms", 1)):
            if getattr(self, field) < low:
                raise ConfigError(f"bus setting {field} must be >= {low}, got {getattr(self, field)}")
        if self.heartbeat_ms * 2 > self.scrub_after_ms:
            raise ConfigError("SWITCHYARD_BUS_HEARTBEAT_MS must be at most half of "
                              "SWITCHYARD_BUS_SCRUB_AFTER_MS (a live worker would be scrubbed)")
        if self.max_mem <= 2 * self.min_free:
            raise ConfigError("SWITCHYARD_BUS_REDIS_MAX_MEM must exceed twice SWITCHYARD_BUS_REDIS_MIN_FREE")
        if self.delivery_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ConfigError("SWITCHYARD_BUS_CONNECT_TIMEOUT_MS and _DELIVERY_TIMEOUT_MS must be > 0")
        try:
            Allowlist.parse(self.callback_allow)
        except ValueError as exc:
            raise ConfigError(f"SWITCHYARD_BUS_CALLBACK_ALLOW: {exc}") from None

    @cached_property
    def allowlist(self) -> Allowlist:
        """The internal destinations an operator lets callbacks reach (none by default)."""
        return Allowlist.parse(self.callback_allow)

    @property
    def key_prefix(self) -> str:
        """``switchyard:bus:{<name>}:``: the braces are a Redis Cluster hash tag, so that every key a
        Lua script touches (a topic's subscribers and their streams, the job queues) is in one slot."""
        return f"switchyard:bus:{{{self.name}}}:"

    @classmethod
    def from_env(cls) -> BusSettings:
        variables = prefixed("SWITCHYARD_BUS_", "name", "max_event_data", "worker_threads", "max_backoff_ms",
                             "scrub_after_ms", "heartbeat_ms", "autodrop_interval_ms", "monitor_interval_ms",
                             "scrub_interval_ms", "max_unclaimed_topics", "unclaimed_topic_ttl_ms",
                             "callback_allow", "max_response_bytes", "max_threads", "host_threads")
        variables |= {"max_mem": "SWITCHYARD_BUS_REDIS_MAX_MEM", "min_free": "SWITCHYARD_BUS_REDIS_MIN_FREE"}
        return fields_from_env(
            cls, variables,
            root_key=root_key_from_env(),
            allow_http_callbacks=os.environ.get("SWITCHYARD_BUS_ALLOW_HTTP_CALLBACKS", "") == "1",
            connect_timeout_s=env_int("SWITCHYARD_BUS_CONNECT_TIMEOUT_MS", 2000) / 1000,
            delivery_timeout_s=env_int("SWITCHYARD_BUS_DELIVERY_TIMEOUT_MS", 20000) / 1000,
        )
