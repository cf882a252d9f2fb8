"""The event bus's HTTP API: Routemaster's, as one Powertools REST resolver with request validation
and an OpenAPI document (``GET /openapi.json``). This module is its face: ``build_app(store)``
makes the API of one bus (``BusApp``: ``resolve(event, context)`` is the Lambda proxy handler);
``openapi_document()`` is its document (``routes``, where the routes are).

Served on AWS by API Gateway (REST) + Lambda (``functions/bus_api.py``) and locally by
``switchyard bus serve`` through ``switchyard.local.http_gateway``, both calling ``resolve``.
The hot path, an accepted publish, is answered by the fast path (``publish``) with the same model
and rules but without the resolver's routing and middleware (half a publish's CPU); every other
request, and every refused publish, goes through the resolver (``routes``). A publish's token is
checked inside the ingest script (no lookup of its own, so nothing to cache: a revoked token stops
publishing at once). Status codes are Routemaster's; where Routemaster is wrong the difference is
on purpose:

- ``DELETE /api_tokens/:token`` revokes the token and removes its subscriber, as Routemaster did
  (root has no subscriber of its own: ``DELETE /subscriber`` is a client's);
- ``DELETE /topics/:name``: only the topic's publisher (or root; an unclaimed topic the client whose
  subscription created it, or root);
- a client's subscriptions create at most ``SWITCHYARD_BUS_MAX_UNCLAIMED_TOPICS`` unclaimed topics
  (403 past it); housekeeping removes old unclaimed topics nobody subscribes to;
- ``GET /subscriptions`` and ``GET /topics`` show a subscriber's ``uuid`` (the credential the bus
  delivers with) only to that subscriber, and other clients' tokens only as their client names;
- an event with a field besides ``type``, ``url``, ``timestamp``, ``data`` is refused (400);
- requests are authenticated before they are validated: without a valid token the answer is 401,
  and a body is read as JSON only after its credential is checked (but an accepted publish's,
  whose token the ingest script checks, in the same round trip); JSON nested deeper than Python's
  recursion limit is a 400, never a crash.
"""

from __future__ import annotations

from switchyard.bus.app import BusApp, build_app
from switchyard.bus.auth import basic_username
from switchyard.bus.errors import BadInputError, UnauthorizedError
from switchyard.bus.models import EventIn, SubscriptionBody, TokenIn, check_callback, check_url
from switchyard.bus.routes import openapi_document

__all__ = [
    "BadInputError",
    "BusApp",
    "EventIn",
    "SubscriptionBody",
    "TokenIn",
    "UnauthorizedError",
    "basic_username",
    "build_app",
    "check_callback",
    "check_url",
    "openapi_document",
]

