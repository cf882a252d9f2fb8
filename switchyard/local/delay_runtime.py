"""The delay scheduler on this machine, through its Lambda handlers.

The MSK bridge feeds the enqueue handler; the fire and sweep handlers run as back-to-back
scheduled invocations, whose fake context reports no time left once Ctrl-C / SIGTERM is received.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from functools import partial
from types import ModuleType

from switchyard.core.config import Connections
from switchyard.core.observability import logger
from switchyard.delay.service import configure
from switchyard.delay.settings import DelaySettings
from switchyard.local import functions as local_functions
from switchyard.local.functions import scheduled_event
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.local.msk_bridge import MskBridge, MskBridgeConfig

FUNCTIONS = {"enqueue": "delay_enqueue", "fire": "delay_fire", "sweep": "delay_sweep"}


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
            target = self._bridge if role == "enqueue" else partial(self._ticks, role)
            thread = threading.Thread(target=target, name=f"delay-{role}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def join(self, timeout_s: float = 15.0) -> None:
        """Stop the loops and wait for them to finish what they hold."""
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads.clear()
