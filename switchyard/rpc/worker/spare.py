"""A warm spare: a worker started before its key is known (``WORKER_SPARE=1``, no ``WORKER_KEY``).

It imports its handler, opens its broker connection, registers in the pool's spare registry
(``switchyard.rpc.spares``) and waits for a key; handed one, it becomes a worker of that key's
group on the connection it already holds: a new key's first call then pays a Redis push and a
consume, not a process start. While it waits it keeps the connection's heartbeats going between
waits; a connection lost meanwhile (a broker restart) is opened again, so a spare is never handed
out with a dead one (and ``Worker`` opens its own if it finds it closed). SIGTERM while waiting:
it withdraws and exits; if a claim won the race, it exits all the same and the group, with no live
worker, is started again by the reconciler as any group whose worker died.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

import pika
import pika.exceptions

from switchyard.core.errors import ConfigError
from switchyard.core.observability import logger
from switchyard.core.redis_client import connect_redis
from switchyard.rpc.amqp import connect
from switchyard.rpc.errors import BrokerUnavailableError
from switchyard.rpc.settings import RpcSettings
from switchyard.rpc.spares import SpareRegistry
from switchyard.rpc.worker.request import Handler, WorkerConfig, WorkerStats, load_handler
from switchyard.rpc.worker.runtime import Worker

WAIT_TURN_S = 1.0  # the longest one wait for a key blocks: the connection's I/O runs between turns


class Spare:
    """Waits for a key, then runs the ``Worker`` for it (``run()`` blocks until either stops)."""

    def __init__(self, handler: Handler, settings: RpcSettings, env: Mapping[str, str],
                 registry: SpareRegistry | None = None) -> None:
        self.worker_id = env.get("WORKER_ID") or ""
        pool = env.get("WORKER_POOL") or ""
        if not self.worker_id or not pool:
            raise ConfigError("a spare needs WORKER_ID and WORKER_POOL (the worker group driver sets them)")
        self.handler = handler
        self.settings = settings
        self.env = dict(env)
        self.registry = registry or SpareRegistry(connect_redis(settings.connections), pool)
        self.worker: Worker | None = None
        self._stopping = False
        self._connection: pika.BlockingConnection | None = None

    def stop(self) -> None:
        """Stop waiting (or stop the worker it became); safe from a signal handler."""
        self._stopping = True
        if self.worker is not None:
            self.worker.stop()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def run(self) -> WorkerStats:
        key = self._wait()
        if key is None or self._stopping:
            return WorkerStats()
        config = WorkerConfig.from_env(self.settings, {**self.env, "WORKER_KEY": key})
        logger.info("spare adopted a key", extra={"worker_id": self.worker_id, "pool": config.pool,
                                                  "queue": config.requests_queue})
        self.worker = Worker(self.handler, config, self.settings, connection=self._connection)
        self.worker.run()
        return self.worker.stats

    def _wait(self) -> str | None:
        self._connect()
        self.registry.register(self.worker_id)
        logger.info("spare waiting for a key", extra={"worker_id": self.worker_id})
        while not self._stopping:
            key = self.registry.wait(self.worker_id, WAIT_TURN_S)
            if key is not None:
                return key
            self._pump()
            self.registry.rejoin(self.worker_id)
        return self.registry.withdraw(self.worker_id)

    def _connect(self) -> None:
        try:
            self._connection = connect(self.settings.connections.amqp_url,
                                       f"switchyard-spare-{self.worker_id}")
        except BrokerUnavailableError:
            self._connection = None  # the next turn tries again; the worker would open its own
            logger.warning("spare cannot reach the broker; trying again", extra={"worker_id": self.worker_id})

    def _pump(self) -> None:
        """Heartbeats, and a lost connection opened again."""
        if self._connection is not None and self._connection.is_open:
            try:
                self._connection.process_data_events(time_limit=0)
                return
            except pika.exceptions.AMQPError:
                logger.warning("spare lost its broker connection; opening another",
                               extra={"worker_id": self.worker_id})
        self._connect()


def run_spare(handler_spec: str, settings: RpcSettings | None = None,
              env: Mapping[str, str] | None = None) -> WorkerStats:
    """Entry point of a spare: wait for a key, then serve it until SIGTERM."""
    settings = settings or RpcSettings.from_env()
    spare = Spare(load_handler(handler_spec), settings, os.environ if env is None else env)
    spare.install_signal_handlers()
    return spare.run()
