"""The Lambda handlers' services: one per part and execution environment, built on first use.

Each part composes itself the same way (``build_service(settings, ...)`` in its ``service.py``,
reading nothing); this adapter reads the settings (``from_env``, after the deployed configuration
from SSM) on a handler's first invocation, never at import, so a cold start's init phase and the
layer's import check call no AWS API. The local runtime ``install``s its own instances (its shared
subprocess driver, its delay service) so the very same handlers of ``functions/`` run on them.
The parts are imported inside the builders: a function loads only the parts it uses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from switchyard.bus.app import BusApp
    from switchyard.bus.service import BusService
    from switchyard.delay.model import InputRecord
    from switchyard.delay.service import DelayService
    from switchyard.pending.api import TurnTakingResolver
    from switchyard.pending.service import PendingQueue
    from switchyard.rpc.service import ControlPlane, ScheduledRelay

T = TypeVar("T")


class OnePerProcess(Generic[T]):
    """A part's service in this process: ``build()`` on the first call, or the one installed."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._service: T | None = None
        self._lock = threading.Lock()

    def __call__(self) -> T:
        with self._lock:
            if self._service is None:
                self._service = self._build()
            return self._service

    def install(self, service: T | None) -> None:
        """Make calls return ``service`` (None: build again on the next call); the caller owns it."""
        with self._lock:
            self._service = service

    @property
    def built(self) -> bool:
        return self._service is not None


def _control_plane() -> ControlPlane:
    from switchyard.rpc.drivers import driver_from_env
    from switchyard.rpc.service import build_service
    from switchyard.rpc.settings import ControlSettings, RpcSettings

    return build_service(ControlSettings.from_env(), RpcSettings.from_env(), driver=driver_from_env())


class _ParkedInDelay:
    """The parked messages of this process's delay service, looked up per batch (the local runtime
    may install another one meanwhile)."""

    def park_records(self, records: list[tuple[InputRecord, str, str]]) -> None:
        delay().store.park_records(records)


def _scheduled_relay() -> ScheduledRelay:
    from switchyard.rpc.service import build_relay
    from switchyard.rpc.settings import RpcSettings

    return build_relay(RpcSettings.from_env(), parked=_ParkedInDelay())


def _delay() -> DelayService:
    from switchyard.core.config import Connections
    from switchyard.delay.service import build_service
    from switchyard.delay.settings import DelaySettings

    return build_service(DelaySettings.from_env(), Connections.from_env())


def _bus() -> BusService:
    from switchyard.bus.service import build_service
    from switchyard.bus.settings import BusSettings
    from switchyard.core.config import Connections

    return build_service(BusSettings.from_env(), Connections.from_env())


def _pending() -> tuple[PendingQueue, TurnTakingResolver]:
    """The node and its API (the endpoints' tokens from ``SWITCHYARD_PENDING_TOKENS[_SECRET_ARN]``)."""
    from switchyard.pending.api import TokenStore, build_app
    from switchyard.pending.service import build_service
    from switchyard.pending.settings import PendingSettings

    queue = build_service(PendingSettings.from_env())
    return queue, build_app(queue, TokenStore.from_env())


control_plane: OnePerProcess[ControlPlane] = OnePerProcess(_control_plane)
scheduled_relay: OnePerProcess[ScheduledRelay] = OnePerProcess(_scheduled_relay)
delay: OnePerProcess[DelayService] = OnePerProcess(_delay)
bus: OnePerProcess[BusService] = OnePerProcess(_bus)
bus_app: OnePerProcess[BusApp] = OnePerProcess(lambda: bus().app())
pending_node: OnePerProcess[tuple[PendingQueue, TurnTakingResolver]] = OnePerProcess(_pending)
