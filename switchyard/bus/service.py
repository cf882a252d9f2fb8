"""Composition, as every part's: ``build_service(settings, connections)`` makes the bus of settings
its caller has read (nothing here reads the environment): the Redis store behind the port, and what
runs on them (the API, a worker). The adapters call it: ``switchyard bus ...`` and the Lambda
functions (through ``switchyard.aws.services``); tests and the demo use ``connect`` with their own
settings and client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from switchyard.bus.settings import BusSettings
from switchyard.bus.store import BusStore
from switchyard.core.config import Connections

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

    def app(self) -> BusApp:
        """The HTTP API (its resolver and fast path) on this bus."""
        from switchyard.bus.app import build_app

        return build_app(self.store)

    def worker(self, threads: int | None = None) -> BusWorker:
        """Delivery threads and housekeeping on this bus (``threads``: SWITCHYARD_BUS_WORKER_THREADS)."""
        from switchyard.bus.worker import BusWorker

        return BusWorker(self.store, threads=threads)


def build_service(settings: BusSettings, connections: Connections) -> BusService:
    """The bus of ``settings`` on the Redis of ``connections`` (connected on first use)."""
    from switchyard.core.redis_client import connect_redis

    return BusService(BusStore(connect_redis(connections), settings))
