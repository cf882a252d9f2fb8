"""The delay scheduler on this machine, through its Lambda handlers.

The MSK bridge feeds the enqueue handler; the fire and sweep handlers run as back-to-back
scheduled invocations, whose fake context reports no time left once Ctrl-C / SIGTERM is received.
A second bridge, on the output topic, feeds the scheduled-call relay
(``switchyard.aws.handlers.rpc_scheduled``) as its AWS mapping does: fired records that name a pool
go into that pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from functools import partial
from types import ModuleType

from switchyard.aws import services
from switchyard.core.config import Connections
from switchyard.core.observability import logger
from switchyard.delay.service import DelayService, build_service
from switchyard.delay.settings import DelaySettings
from switchyard.local import functions as local_functions
from switchyard.local.functions import scheduled_event
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.local.msk_bridge import MskBridge, MskBridgeConfig

FUNCTIONS = {"enqueue": "delay_enqueue", "fire": "delay_fire", "sweep": "delay_sweep",
             "scheduled": "rpc_scheduled"}
BRIDGED = frozenset({"enqueue", "scheduled"})  # roles fed by an MSK bridge (the others tick)
SCHEDULED_GROUP_SUFFIX = "-scheduled"  # the relay's consumer group: the scheduler's own, suffixed
RELAY_WINDOW_MS = 5
RELAY_FETCH_WAIT_MS = 10  # tansu answers a fetch when this runs out, not at the first record


def load_function(role: str) -> ModuleType:
    """The Lambda handler of ``functions/delay_<role>.py`` (that very code, not a copy)."""
    return local_functions.load_function(FUNCTIONS[role])


def install_service(settings: DelaySettings, connections: Connections) -> DelayService:
    """Build the delay service the handlers of ``functions/`` use in this process (the one they
    used before is closed)."""
    previous = services.delay() if services.delay.built else None
    svc = build_service(settings, connections)
    services.delay.install(svc)
    if previous is not None:
        previous.close()
    return svc


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
        self.errors: dict[str, str] = {}

    def _bridge(self, role: str) -> None:
        handler = load_function(role).lambda_handler
        s = self.settings
        # The relay's window is as short as its AWS mapping's (0 s): a fired call waits for no batch.
        topic, group, window_ms = ((s.input_topic, s.consumer_group, s.batch_window_ms) if role == "enqueue"
                                   else (s.output_topic, s.consumer_group + SCHEDULED_GROUP_SUFFIX,
                                         RELAY_WINDOW_MS))
        config = MskBridgeConfig(
            bootstrap=self.connections.kafka_bootstrap, topic=topic, group_id=group,
            function_name=FUNCTIONS[role], batch_size=s.batch_size, batching_window_ms=window_ms,
            session_timeout_ms=2000, fetch_min_bytes=65536 if role == "enqueue" else 1,
            fetch_wait_max_ms=100 if role == "enqueue" else RELAY_FETCH_WAIT_MS,
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
        svc = install_service(self.settings, self.connections)
        svc.store.migrate()
        for role in self.roles:
            target = partial(self._guarded, self._bridge if role in BRIDGED else self._ticks, role)
            thread = threading.Thread(target=target, name=f"delay-{role}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _guarded(self, loop: Callable[[str], None], role: str) -> None:
        """``loop(role)``, its error kept for ``ended`` (the runner names it and exits)."""
        try:
            loop(role)
        except Exception as exc:
            self.errors[role] = f"{type(exc).__name__}: {exc}"

    def ended(self) -> dict[str, str]:
        """The roles whose loop ended before ``stop``, with why (a daemon must say so, not run on empty)."""
        if self.stop.is_set():
            return {}
        dead = [t.name.removeprefix("delay-") for t in self._threads if not t.is_alive()]
        return {role: self.errors.get(role, "returned") for role in dead}

    def join(self, timeout_s: float = 15.0) -> None:
        """Stop the loops and wait for them to finish what they hold."""
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads.clear()
