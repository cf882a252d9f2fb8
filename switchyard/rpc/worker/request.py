"""What a handler author works with: ``Request`` in, ``Requeue`` to hand it back, and the worker's
configuration from the worker protocol's environment (the keyed RPC design, "Worker protocol")."""

from __future__ import annotations

import importlib
import math
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from switchyard.core.errors import ConfigError
from switchyard.rpc import protocol
from switchyard.rpc.settings import RpcSettings


class Requeue(Exception):
    """Raise from a handler to give the request back to the queue for another worker."""


@dataclass(frozen=True, slots=True)
class Request:
    key: str
    body: bytes
    correlation_id: str | None
    reply_to: str | None
    headers: Mapping[str, Any]
    redelivered: bool
    worker_id: str

    @property
    def delivery_count(self) -> int:
        """How many times this request was delivered before (quorum queues), sheds included."""
        return sum(count_header(self.headers, h)
                   for h in (protocol.DELIVERY_COUNT_HEADER, protocol.REDELIVERIES_HEADER))

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


Handler = Callable[[Request], "bytes | str | None"]


def count_header(headers: Mapping[str, Any], name: str) -> int:
    """A count header as a number: anything but a non-negative integer (``"zz"`` from a stranger's
    client) counts 0, rather than failing the worker where the count is only carried."""
    value = headers.get(name)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True)
class WorkerConfig:
    """The worker protocol's environment (the keyed RPC design, "Worker protocol")."""

    worker_id: str
    key: str
    pool: str
    requests_queue: str
    activity_exchange: str
    prefetch: int = 4
    ack_delay_ms: float = 5.0  # the longest an answered request waits for its ack (0: each at once)
    activity_interval: float = 1.0
    queue_wait: float = 30.0  # seconds to wait for a request queue that does not exist yet

    @classmethod
    def from_env(
        cls, settings: RpcSettings | None = None, env: Mapping[str, str] | None = None
    ) -> WorkerConfig:
        env = os.environ if env is None else env
        settings = settings or RpcSettings.from_env()
        pool = env.get("WORKER_POOL")
        key = env.get("WORKER_KEY")
        if pool is None or key is None:
            raise ConfigError("WORKER_POOL and WORKER_KEY must be set (the worker group driver sets them)")
        raw_delay = env.get("WORKER_ACK_DELAY_MS") or settings.worker_ack_delay_ms
        try:
            ack_delay_ms = float(raw_delay)
        except ValueError:
            ack_delay_ms = math.nan
        if not 0 <= ack_delay_ms <= 60_000:
            raise ConfigError(f"WORKER_ACK_DELAY_MS must be ms from 0 to 60000, got {raw_delay!r}")
        return cls(
            worker_id=env.get("WORKER_ID") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
            key=key,
            pool=protocol.validate_pool(pool),
            requests_queue=env.get("WORKER_REQUESTS_QUEUE") or protocol.request_queue(pool, key),
            activity_exchange=env.get("WORKER_ACTIVITY_EXCHANGE") or protocol.activity_exchange(pool),
            prefetch=int(env.get("WORKER_PREFETCH") or settings.worker_prefetch),
            ack_delay_ms=ack_delay_ms,
            activity_interval=float(env.get("WORKER_ACTIVITY_INTERVAL") or settings.activity_interval),
            queue_wait=float(env.get("WORKER_QUEUE_WAIT") or 30.0),
        )


@dataclass
class WorkerStats:
    handled: int = 0
    errors: int = 0
    requeued: int = 0
    no_reply_to: int = 0
    waited_for_queue: int = 0  # consumes refused (404) before the request queue was declared
    queue_races: int = 0  # connections the broker closed on a consume racing the queue's creation
    queue_deleted: bool = False  # the broker cancelled the consumer: the request queue is gone
    poisoned: int = 0  # requests whose headers could not be decoded, sent to {pool}-poison


def load_handler(spec: str) -> Handler:
    """Import ``module:function``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"handler must look like module:function, got {spec!r}")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load handler {spec!r}: {exc}") from exc
    except Exception as exc:  # the module's own code failed as it was imported: the user's to fix
        raise ConfigError(f"cannot load handler {spec!r}: importing {module_name} raised "
                          f"{type(exc).__name__}: {exc}") from exc
    if not callable(target):
        raise ConfigError(f"handler {spec!r} is not callable")
    return target
