"""The event bus: Routemaster's API and delivery, with per-subscriber order.

An application composes it with ``BusService`` (``from_env()`` or ``connect(settings)``), whose
``app()`` is the HTTP API (``switchyard.bus.api``) and ``worker()`` the delivery process
(``switchyard.bus.worker``); ``switchyard.bus.errors`` holds what either raises."""

from switchyard.bus.errors import BusError
from switchyard.bus.service import BusService
from switchyard.bus.settings import BusSettings

__all__ = ["BusError", "BusService", "BusSettings"]
