"""Settings of the event bus: Routemaster's knobs under ``SWITCHYARD_BUS_*`` names.

Every value is read and checked here once, so a bad setting fails at start-up, not in a delivery.
docs/configuration.md lists each variable; keep the two in step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from switchyard.bus.callbacks import Allowlist
from switchyard.core.config import Setting, build, config_source
from switchyard.core.errors import ConfigError

_BUS_NAME_RE = re.compile(r"^[a-z0-9_-]{1,64}$")


def _bus(name: str, default: object, doc: str, unit: str = "", **more: Any) -> Setting[Any]:
    return Setting(f"SWITCHYARD_BUS_{name}", default, doc, unit=unit, **more)


NAME = _bus("NAME", "main",
            "the event bus's name: its Redis keys are `switchyard:bus:{<name>}:*` (one cluster slot)")
ROOT_KEY = _bus("ROOT_KEY", "", "the root key (Routemaster's `ROUTEMASTER_ROOT_KEY`); on AWS the `root_key` "
                "field of the JSON secret `SWITCHYARD_BUS_SECRET_ARN`", shown="none (no token management)")
SECRET_ARN = _bus("SECRET_ARN", "", "on AWS: the JSON secret whose `root_key` field is the root key")
ALLOW_HTTP_CALLBACKS = _bus(
    "ALLOW_HTTP_CALLBACKS", False, "`1`: also accept `http://` callbacks to loopback hosts (local runs and "
    "tests only; each must also be in the allowlist below)", shown="unset")
CALLBACK_ALLOW = _bus(
    "CALLBACK_ALLOW", "", "internal destinations callbacks may reach, comma-separated: `host`, `host:port`, "
    "an address, `address:port` (`[v6]:port`) or a network `a.b.c.d/n`; everything else that is not a "
    "public address is refused (see [security](security.md#what-a-subscribers-callback-can-reach))",
    shown="none")
MAX_EVENT_DATA = _bus("MAX_EVENT_DATA_BYTES", 1024, "bytes of JSON an event's `data` may have", unit="bytes",
                      old=("SWITCHYARD_BUS_MAX_EVENT_DATA",))
WORKER_THREADS = _bus("WORKER_THREADS", 4, "delivery threads of one `switchyard bus worker`")
MAX_THREADS = _bus("MAX_THREADS", 16, "delivery threads of one worker at most, when every one is busy (more "
                   "start one at a time, and end when idle)")
HOST_THREADS = _bus(
    "HOST_THREADS", 2, "deliveries to one callback host and port (the scheme's default port if the URL names "
    "none) in flight at once, per worker process (past it a delivery waits 200 ms, not counted as a failure)")
CONNECT_TIMEOUT = _bus("CONNECT_TIMEOUT_MS", 2000, "delivery connect timeout", unit="ms")
DELIVERY_TIMEOUT = _bus("DELIVERY_TIMEOUT_MS", 20000, "wall-clock deadline of a whole delivery (name lookup, "
                        "connect, send, every byte of the answer)", unit="ms")
MAX_RESPONSE_BYTES = _bus("MAX_RESPONSE_BYTES", 4096, "bytes of a callback's answer the worker reads at most "
                          "(only the status counts)", unit="bytes")
MAX_BACKOFF = _bus("MAX_BACKOFF_MS", 60_000, "backoff after a failure: `round(this * 2^-hp)` ms", unit="ms")
SCRUB_AFTER = _bus("SCRUB_AFTER_MS", 30_000, "a worker unseen this long has its pending jobs put back",
                   unit="ms")
HEARTBEAT = _bus("HEARTBEAT_MS", 2_000, "how often workers say they live (at most half of "
                 "`SWITCHYARD_BUS_SCRUB_AFTER_MS`)", unit="ms")
REDIS_MAX_MEM = _bus("REDIS_MAX_MEM_BYTES", 100_000_000, "autodrop: above max - min_free bytes used, drop "
                     "the oldest batches until below max - 2 x min_free", unit="bytes",
                     old=("SWITCHYARD_BUS_REDIS_MAX_MEM",))
REDIS_MIN_FREE = _bus("REDIS_MIN_FREE_BYTES", 10_000_000, "autodrop's min_free (see the row above)",
                      unit="bytes", old=("SWITCHYARD_BUS_REDIS_MIN_FREE",))
AUTODROP_INTERVAL = _bus("AUTODROP_INTERVAL_MS", 10_000, "how often a worker runs autodrop", unit="ms")
MONITOR_INTERVAL = _bus("MONITOR_INTERVAL_MS", 10_000, "how often a worker runs telemetry", unit="ms")
SCRUB_INTERVAL = _bus("SCRUB_INTERVAL_MS", 10_000, "how often a worker runs the scrubber", unit="ms")
MAX_UNCLAIMED_TOPICS = _bus(
    "MAX_UNCLAIMED_TOPICS", 100, "unclaimed topics one client's subscriptions may have created (each counts "
    "until a publisher claims it or it is deleted); a subscription that would pass it is refused (403)")
UNCLAIMED_TOPIC_TTL = _bus("UNCLAIMED_TOPIC_TTL_MS", 3_600_000, "autodrop removes an unclaimed topic nobody "
                           "subscribes to once it is this old", unit="ms")
BUS: dict[str, Setting[Any]] = {
    "name": NAME, "allow_http_callbacks": ALLOW_HTTP_CALLBACKS, "callback_allow": CALLBACK_ALLOW,
    "max_event_data": MAX_EVENT_DATA, "worker_threads": WORKER_THREADS, "max_threads": MAX_THREADS,
    "host_threads": HOST_THREADS, "max_response_bytes": MAX_RESPONSE_BYTES, "max_backoff_ms": MAX_BACKOFF,
    "scrub_after_ms": SCRUB_AFTER, "heartbeat_ms": HEARTBEAT,
    "max_mem": REDIS_MAX_MEM, "min_free": REDIS_MIN_FREE,
    "autodrop_interval_ms": AUTODROP_INTERVAL, "monitor_interval_ms": MONITOR_INTERVAL,
    "scrub_interval_ms": SCRUB_INTERVAL, "max_unclaimed_topics": MAX_UNCLAIMED_TOPICS,
    "unclaimed_topic_ttl_ms": UNCLAIMED_TOPIC_TTL,
}


def root_key_from_env(source: Mapping[str, str] | None = None) -> str:
    """The root key: ``ROOT_KEY``, else the ``root_key`` field of the JSON secret named by
    ``SECRET_ARN`` (AWS: Lambda has no secret injection). "" disables root."""
    source = config_source() if source is None else source
    key: str = ROOT_KEY.read(source)
    arn: str = SECRET_ARN.read(source)
    if key or not arn:
        return key
    from switchyard.core.aws_secrets import fetch_secret

    return fetch_secret(arn).get("root_key", "")


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
            raise ConfigError(f"{NAME.name} must match [a-z0-9_-]{{1,64}}, got {self.name!r}")
        for field, low in (("worker_threads", 1), ("max_event_data", 0), ("max_backoff_ms", 1),
                           ("max_response_bytes", 0), ("host_threads", 1),
                           ("max_threads", self.worker_threads),
                           ("heal_rate", 1), ("damage_rate", 1), ("scrub_after_ms", 1),
                           ("heartbeat_ms", 1), ("schedule_interval_ms", 1), ("min_free", 0),
                           ("max_unclaimed_topics", 0), ("unclaimed_topic_ttl_ms", 1)):
            if getattr(self, field) < low:
                raise ConfigError(f"bus setting {field} must be >= {low}, got {getattr(self, field)}")
        if self.heartbeat_ms * 2 > self.scrub_after_ms:
            raise ConfigError(f"{HEARTBEAT.name} must be at most half of {SCRUB_AFTER.name} "
                              "(a live worker would be scrubbed)")
        if self.max_mem <= 2 * self.min_free:
            raise ConfigError(f"{REDIS_MAX_MEM.name} must exceed twice {REDIS_MIN_FREE.name}")
        if self.delivery_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ConfigError(f"{CONNECT_TIMEOUT.name} and {DELIVERY_TIMEOUT.name} must be > 0")
        try:
            Allowlist.parse(self.callback_allow)
        except ValueError as exc:
            raise ConfigError(f"{CALLBACK_ALLOW.name}: {exc}") from None

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
    def from_env(cls, source: Mapping[str, str] | None = None) -> BusSettings:
        source = config_source() if source is None else source
        return build(cls, BUS, source, root_key=root_key_from_env(source),
                     connect_timeout_s=CONNECT_TIMEOUT.read(source) / 1000,
                     delivery_timeout_s=DELIVERY_TIMEOUT.read(source) / 1000)
