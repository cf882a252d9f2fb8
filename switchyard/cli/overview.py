"""The whole system's figures in one read, for ``switchyard status`` and ``switchyard console``.

Each part gives its own figures (``switchyard.<part>.status``); this module only gathers them, in
parallel, from the services the settings point at (the local ones, or a deployed stack's after
``--stack``). A part whose services do not answer is reported as unreachable, with the one-line
reason (the 1 s TCP check of ``preflight`` first, so a service that is down costs a second, not a
client's retries), and the other parts are read all the same.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from switchyard.cli.preflight import require, unavailable
from switchyard.core import parts
from switchyard.core.config import Connections
from switchyard.core.errors import SwitchyardError
from switchyard.core.observability import redact_url
from switchyard.core.reader import CONFIG_PATH

PARTS = (parts.RPC, parts.DELAY, parts.BUS, parts.PENDING)  # the parts with figures to read
# What reading a part's figures needs (less than running it: delay's figures are all in Postgres).
SERVICES = {parts.RPC: ("amqp", "redis", "management"), parts.DELAY: ("postgres",), parts.BUS: ("redis",),
            parts.PENDING: ("redis",)}
READ_TIMEOUT_S = 5.0  # the longest one part's read may take (each client's own timeout)
OK, UNREACHABLE = "ok", "unreachable"  # a part's state


@dataclass(frozen=True)
class PartStatus:
    part: str
    figures: Any  # the part's status object (with to_dict), or None when unreachable
    unreachable: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"state": "ok", <the part's figures>}`` or ``{"state": "unreachable", "reason": ...}``.
        The figures' keys are field names, never a user's: a pool, key, subscriber or endpoint
        name is a value (``{"endpoints": [{"endpoint": "unreachable", ...}]}``), so no name can
        read as a state."""
        if self.unreachable is not None:
            return {"state": UNREACHABLE, "reason": self.unreachable}
        return {"state": OK, **self.figures.to_dict()}


@dataclass(frozen=True)
class PoolsStatus:
    """The rpc part: every pool the control plane knows, or those asked for."""

    pools: tuple[Any, ...]  # switchyard.rpc.status.PoolFigures

    def to_dict(self) -> dict[str, Any]:
        return {"pools": [pool.to_dict() for pool in self.pools]}


@dataclass(frozen=True)
class SystemStatus:
    at: float  # epoch s
    source: str | None  # the deployed configuration's path (--stack), None for the local settings
    parts: tuple[PartStatus, ...]

    @property
    def reachable(self) -> bool:
        """Whether any part could be read (``switchyard status`` fails only when none could)."""
        return any(part.unreachable is None for part in self.parts)

    def part(self, name: str) -> PartStatus:
        return next(p for p in self.parts if p.part == name)

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "source": self.source, **{p.part: p.to_dict() for p in self.parts}}


def reason(exc: BaseException) -> str:
    """One line saying why a part could not be read (credentials never shown)."""
    if isinstance(exc, SwitchyardError):
        text = str(exc)
    else:
        text = unavailable(exc) or f"{type(exc).__name__}: {exc}"
    return redact_url(" ".join(text.split()))


class Overview:
    """Reads every part's figures; keeps its clients between reads (``--watch``, the console)."""

    def __init__(self, pools: Sequence[str] = (), connections: Connections | None = None) -> None:
        self.pools = tuple(pools)
        self.connections = connections or Connections.from_env()
        self._clients: dict[str, Any] = {}
        self._executor = ThreadPoolExecutor(max_workers=len(PARTS), thread_name_prefix="status")

    def read(self) -> SystemStatus:
        readers: dict[str, Callable[[], Any]] = {"rpc": self._rpc, "delay": self._delay, "bus": self._bus,
                                                 "pending": self._pending}
        futures = {name: self._executor.submit(self._read_part, name, readers[name]) for name in PARTS}
        parts = tuple(futures[name].result() for name in PARTS)
        return SystemStatus(time.time(), CONFIG_PATH.read(os.environ) or None, parts)

    def _read_part(self, name: str, read: Callable[[], Any]) -> PartStatus:
        try:
            require(*SERVICES[name], connections=self.connections)
            return PartStatus(name, read())
        except Exception as exc:  # one part down must not hide the others
            self._clients.pop(name, None)  # a new client on the next read
            return PartStatus(name, None, reason(exc))

    def _client(self, name: str, make: Callable[[], Any]) -> Any:
        if name not in self._clients:
            self._clients[name] = make()
        return self._clients[name]

    def _redis(self) -> Any:
        from switchyard.core.redis_client import connect_redis

        return connect_redis(self._reading())

    def _reading(self) -> Connections:
        """The connections, with the status read's short Redis timeout."""
        from dataclasses import replace

        return replace(self.connections, redis_timeout_s=READ_TIMEOUT_S)

    def _rpc(self) -> PoolsStatus:
        from switchyard.rpc.control.management import ManagementApi, vhost_from_amqp_url
        from switchyard.rpc.status import known_pools, pool_figures, worker_ids

        client = self._client("rpc", lambda: (self._redis(), ManagementApi(
            self.connections.management_url, vhost_from_amqp_url(self.connections.amqp_url),
            timeout=READ_TIMEOUT_S)))
        redis, management = client
        pools = self.pools or known_pools(redis, management)
        workers = worker_ids(management) if pools else {}  # every pool's in one listing
        return PoolsStatus(tuple(pool_figures(pool, redis, management, workers=workers) for pool in pools))

    def _delay(self) -> Any:
        from switchyard.delay.settings import DelaySettings
        from switchyard.delay.status import delay_status
        from switchyard.delay.store import PostgresDelayStore

        store = self._client("delay", lambda: PostgresDelayStore(
            self.connections.postgres_dsn, DelaySettings.from_env().schema, "switchyard-status",
            READ_TIMEOUT_S))
        return delay_status(store)

    def _bus(self) -> Any:
        from switchyard.bus.service import build_service
        from switchyard.bus.settings import BusSettings
        from switchyard.bus.status import read_telemetry

        bus = self._client("bus", lambda: build_service(BusSettings.from_env(), self._reading()))
        return read_telemetry(bus.store)

    def _pending(self) -> Any:
        from switchyard.pending.service import build_service
        from switchyard.pending.settings import PendingSettings
        from switchyard.pending.status import pending_status

        node = self._client("pending",
                            lambda: build_service(PendingSettings.from_env(), client=self._redis()))
        return pending_status(node)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        store = self._clients.pop("delay", None)
        if store is not None:
            store.close()
