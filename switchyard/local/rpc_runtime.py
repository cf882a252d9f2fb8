"""``switchyard local``: a pool's control plane on this machine, through the Lambda handlers.

Three RabbitMQ event-source bridges (orphans, dead letters, activity) consume the pool's queues
as the Amazon MQ mappings would and call ``functions/rpc_*.py``; a ticker calls the reconciler
handler with a scheduled event every ``reconcile_interval`` seconds. One in-process subprocess
driver serves both, so the workers it starts are the ones the reconciler sees.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from switchyard.aws import services
from switchyard.core.observability import logger
from switchyard.local.functions import load_function, scheduled_event
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.local.rmq_bridge import RabbitMQEventSource
from switchyard.rpc import protocol
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.drivers import WorkerGroupDriver, driver_from_env
from switchyard.rpc.service import ControlPlane, build_service
from switchyard.rpc.settings import DEMO_HANDLER, ControlSettings, DriverSettings, RpcSettings


def local_driver(pool: str = "") -> WorkerGroupDriver:
    """The environment's driver, whose workers locally answer with the demo handler unless one is
    set (a deployment must set it: production has no default); ``pool``: whose spares it keeps."""
    return driver_from_env(DriverSettings.from_env(default_handler=DEMO_HANDLER), pool)


def local_plane() -> ControlPlane:
    """The environment's control plane with ``local_driver`` (``switchyard invoke``'s)."""
    control = ControlSettings.from_env()
    return build_service(control, RpcSettings.from_env(), driver=local_driver(control.pool))


@dataclass(frozen=True)
class BridgeSettings:
    """Batching of the three mappings (the Amazon MQ mapping allows up to 10,000 and 300 s)."""

    orphan_batch: int = 1000
    dead_letter_batch: int = 100
    activity_batch: int = 1000
    window_s: float = 0.05
    # A new key's first call waits out the orphans' window: 50 ms was half of a spare's adoption.
    # A burst's orphans arrive within a few ms (and more gather while a batch is handled).
    orphan_window_s: float = 0.005


class LocalControlPlane:
    def __init__(self, control: ControlSettings, settings: RpcSettings | None = None,
                 driver: WorkerGroupDriver | None = None, bridges: BridgeSettings | None = None) -> None:
        self.control = control
        self.settings = settings or RpcSettings.from_env()
        self.plane = build_service(control, self.settings, driver=driver or local_driver(control.pool))
        self.bridges = bridges or BridgeSettings()
        self.sources: list[RabbitMQEventSource] = []
        self.reconcile_passes = 0
        self.last_reconcile: dict = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def driver(self) -> WorkerGroupDriver:
        return self.plane.driver

    def start(self) -> LocalControlPlane:
        pool = self.control.pool
        with PoolTopology(pool, self.settings) as topology:
            topology.declare()
        services.control_plane.install(self.plane)
        b = self.bridges
        for queue, function, batch, window_s in (
            (protocol.orphan_queue(pool), "rpc_orphans", b.orphan_batch, min(b.window_s, b.orphan_window_s)),
            (protocol.dl_queue(pool), "rpc_dead_letters", b.dead_letter_batch, b.window_s),
            (protocol.activity_queue(pool), "rpc_activity", b.activity_batch, b.window_s),
        ):
            source = RabbitMQEventSource(
                queue, load_function(function).lambda_handler, amqp_url=self.settings.connections.amqp_url,
                function_name=f"{function}-{pool}", batch_size=batch, batching_window_s=window_s)
            self.sources.append(source)
            self._threads.append(source.run_in_thread(self._stop))
        ticker = threading.Thread(target=self._tick, name=f"reconciler-{pool}", daemon=True)
        ticker.start()
        self._threads.append(ticker)
        logger.info("local control plane started", extra={"pool": pool})
        return self

    def _tick(self) -> None:
        handler = load_function("rpc_reconcile").lambda_handler
        name = f"rpc_reconcile-{self.control.pool}"
        while not self._stop.is_set():
            try:
                self.last_reconcile = handler(scheduled_event(name), FakeLambdaContext(name, 60_000))
                self.reconcile_passes += 1
            except Exception:  # the next tick tries again, as the schedule would
                logger.exception("reconciler pass failed", extra={"pool": self.control.pool})
            self._stop.wait(self.control.reconcile_interval_s)

    def ended(self) -> list[str]:
        """The threads (event sources, the reconciler) that ended before ``stop``."""
        if self._stop.is_set():
            return []
        return [t.name for t in self._threads if not t.is_alive()]

    def stop(self) -> None:
        """Stop the bridges (each settles its batch in hand), the ticker, then the workers."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        services.control_plane.install(None)
        self.plane.close()

    def __enter__(self) -> LocalControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
