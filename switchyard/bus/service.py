"""The bus as a process composes it once: its settings, the Redis store behind the port, and what
runs on them (the API, a worker). ``from_env`` is what ``switchyard bus ...`` and the Lambda
functions use; tests and the demo pass their own settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from switchyard.bus.settings import BusSettings
from switchyard.bus.store import BusStore

if TYPE_CHECKING:
    from switchyard.bus.app import BusApp
    from switchyard.bus.worker import BusWorker
    from switchyard.core.redis_client import RedisClient


@dataclass(frozen=True)
class BusService:
    """One bus in one process."""

    store: BusStore

    @property
    def settings(self) -> BusSettings:
        return self.store.settings

    @classmethod
    def connect(cls, settings: BusSettings | None = None, client: RedisClient | None = None) -> BusService:
        """The bus of ``settings`` (default: ``SWITCHYARD_BUS_*``) on ``client`` (default: the
        ``SWITCHYARD_REDIS_URL`` client; opening it connects nothing yet)."""
        from switchyard.core.redis_client import connect_redis

        return cls(BusStore(client or connect_redis(), settings or BusSettings.from_env()))

    @classmethod
    def from_env(cls) -> BusService:
        """The bus of ``SWITCHYARD_BUS_*`` on ``SWITCHYARD_REDIS_URL``."""
        return cls.connect()

    def app(self) -> BusApp:
        """The HTTP API (its resolver and fast path) on this bus."""
        from switchyard.bus.app import build_app

        return build_app(self.store)

    def worker(self, threads: int | None = None) -> BusWorker:
        """Delivery threads and housekeeping on this bus (``threads``: SWITCHYARD_BUS_WORKER_THREADS)."""
        from switchyard.bus.worker import BusWorker

        return BusWorker(self.store, threads=threads)
