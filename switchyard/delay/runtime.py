"""Composition: one DelayService per process (connections made once, lazily), and the local runtime.

Lambda handlers call ``service()``; the first call builds it from the environment. The local
runtime runs the same handlers: the MSK bridge for enqueue, and back-to-back scheduled invocations
for fire and sweep, whose fake context reports no time left once Ctrl-C / SIGTERM is received.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from types import ModuleType

from switchyard.config import Connections
from switchyard.delay.enqueue import enqueue_records
from switchyard.delay.fire import FireLoop
from switchyard.delay.model import Drop, EnqueueOutcome, FireOutcome, InputRecord, SweepOutcome
from switchyard.delay.publisher import KafkaPublisher
from switchyard.delay.settings import DelaySettings
from switchyard.delay.store import PostgresDelayStore
from switchyard.delay.sweep import run_sweeps
from switchyard.local import functions as local_functions
from switchyard.local.functions import scheduled_event
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.local.msk_bridge import MskBridge, MskBridgeConfig
from switchyard.observability import logger

FUNCTIONS = {"enqueue": "delay_enqueue", "fire": "delay_fire", "sweep": "delay_sweep"}


class DelayService:
    """A queuing node: its id, its store and its publishers; the three operations of the seed."""

    def __init__(self, settings: DelaySettings, connections: Connections, node_id: str | None = None) -> None:
        self.settings = settings
        self.connections = connections
        self.node_id = node_id or str(uuid.uuid4())
        self.store = PostgresDelayStore(connections.postgres_dsn, settings.schema, settings.application_name,
                                        settings.store_timeout_ms / 1000)
        self._local = threading.local()
        logger.info(f"delay node {self.node_id} started", extra={"node_id": self.node_id})

    def publisher(self) -> KafkaPublisher:
        """This thread's producer for the output topic."""
        pub = getattr(self._local, "publisher", None)
        if pub is None:
            pub = KafkaPublisher(self.connections.kafka_bootstrap, self.settings.output_topic,
                                 self.settings.publish_timeout_ms, self.settings.publish_linger_ms,
                                 self.settings.max_message_bytes)
            self._local.publisher = pub
        return pub

    def enqueue(self, records: Iterable[InputRecord | Drop]) -> EnqueueOutcome:
        return enqueue_records(records, self.store, self.publisher(), self.settings)

    def fire(self, remaining_ms: Callable[[], int]) -> FireOutcome:
        return FireLoop(self.store, self.publisher(), self.settings, self.node_id).run(remaining_ms)

    def sweep(self, remaining_ms: Callable[[], int]) -> SweepOutcome:
        return run_sweeps(self.store, self.settings, remaining_ms)

    def close(self) -> None:
        self.store.close()


_service: DelayService | None = None
_service_lock = threading.Lock()


def service() -> DelayService:
    """The process's DelayService, built from the environment on first use."""
    global _service
    with _service_lock:
        if _service is None:
            _service = DelayService(DelaySettings.from_env(), Connections.from_env())
        return _service


def configure(settings: DelaySettings, connections: Connections, node_id: str | None = None) -> DelayService:
    """Replace the process's DelayService (local runtime, CLI and tests)."""
    global _service
    with _service_lock:
        if _service is not None:
            _service.close()
        _service = DelayService(settings, connections, node_id)
        return _service


def load_function(role: str) -> ModuleType:
    """``functions/delay_<role>.py`` (the Lambda code itself, not a copy)."""
    return local_functions.load_function(FUNCTIONS[role])


class LocalRuntime:
    """Runs the enqueue bridge and the fire / sweep tick loops continuously, in threads, until stopped."""

    def __init__(self, settings: DelaySettings, connections: Connections, roles: Iterable[str] = FUNCTIONS,
                 invocation_ms: int = 900_000) -> None:
        self.settings = settings
        self.connections = connections
        self.roles = tuple(roles)
        self.invocation_ms = invocation_ms
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _bridge(self) -> None:
        handler = load_function("enqueue").lambda_handler
        config = MskBridgeConfig(
            bootstrap=self.connections.kafka_bootstrap, topic=self.settings.input_topic,
            group_id=self.settings.consumer_group, function_name="delay_enqueue",
            batch_size=self.settings.batch_size, batching_window_ms=self.settings.batch_window_ms,
            session_timeout_ms=2000,
        )
        MskBridge(config, handler).run(self.stop)

    def _ticks(self, role: str) -> None:
        handler = load_function(role).lambda_handler
        while not self.stop.is_set():
            # On stop, the margin an invocation keeps for its end: held rows are confirmed and deleted.
            context = FakeLambdaContext(FUNCTIONS[role], self.invocation_ms, self.stop,
                                        stop_grace_ms=self.settings.stop_margin_ms)
            try:
                handler(scheduled_event(f"switchyard-{FUNCTIONS[role]}"), context)
            except Exception:
                logger.exception("scheduled invocation failed", extra={"function_name": FUNCTIONS[role]})
                self.stop.wait(1.0)

    def start(self) -> None:
        svc = configure(self.settings, self.connections)
        svc.store.migrate()
        for role in self.roles:
            target = self._bridge if role == "enqueue" else lambda r=role: self._ticks(r)
            thread = threading.Thread(target=target, name=f"delay-{role}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def join(self, timeout_s: float = 15.0) -> None:
        """Stop the loops and wait for them to finish what they hold."""
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads.clear()
