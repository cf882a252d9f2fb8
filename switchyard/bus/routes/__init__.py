"""The bus API's routes: Routemaster's endpoints on one Powertools REST resolver, with request
validation, its exception handlers (Routemaster's status codes) and an OpenAPI document. Every
refusal is answered here, the fast path's too (``publish.fast_publish`` declines them).

One Powertools ``Router`` per module (``health``, ``tokens``, ``topics``, ``subscriptions``), each
made for one bus (``common.BusRequest``) and included, in that order, by ``build_resolver``.
"""

from __future__ import annotations

import json

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError

from switchyard import __version__
from switchyard.bus.auth import ANYONE, Credentials
from switchyard.bus.errors import BadInputError, StoreError, UnauthorizedError
from switchyard.bus.ports import BusStorePort
from switchyard.bus.publish import Publisher
from switchyard.bus.routes import health, subscriptions, tokens, topics
from switchyard.bus.routes.common import (
    BusRequest,
    json_answer,
    storage_unavailable,
    text,
    unauthorized_text,
)
from switchyard.core.observability import redact

__all__ = ["build_resolver", "openapi_document", "storage_unavailable", "text", "unauthorized_text"]


def build_resolver(store: BusStorePort, credentials: Credentials,
                   publisher: Publisher) -> APIGatewayRestResolver:
    """The resolver of one bus: every route, bound to its store."""
    app = APIGatewayRestResolver(enable_validation=True)
    bus = BusRequest(app, store, credentials, publisher)
    _answer_refusals(app, bus)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> Response[str]:
        return json_answer(200, json.loads(openapi_document(app)))

    for module in (health, tokens, topics, subscriptions):
        app.include_router(module.router(bus))
    return app


def _answer_refusals(app: APIGatewayRestResolver, bus: BusRequest) -> None:
    """Routemaster's status codes for what the routes raise; authentication always first."""

    @app.exception_handler(UnauthorizedError)
    def _unauthorized(exc: UnauthorizedError) -> Response[str]:
        return Response(status_code=401, content_type="text/plain", headers={"WWW-Authenticate": "Basic"},
                        body=unauthorized_text(exc))

    @app.exception_handler(BadInputError)
    def _bad_input(exc: BadInputError) -> Response[str]:
        if bus.caller() is None:  # authentication first, whatever is wrong with the input
            return _unauthorized(ANYONE)
        return text(400, str(exc))

    @app.exception_handler(RequestValidationError)
    def _invalid(exc: RequestValidationError) -> Response[str]:
        """Bad input is 400 (Routemaster's code), once the caller has shown a valid credential."""
        if bus.caller() is None:
            return _unauthorized(ANYONE)
        errors = exc.errors()
        event = app.current_event
        if event.http_method == "POST" and event.path.startswith("/topics/"):
            bad_path = any(e.get("loc", ("",))[0] == "path" for e in errors)
            return text(400, "bad topic" if bad_path else "bad event")
        details = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg', '')}"
                            for e in errors[:5])
        return text(400, redact(f"bad data in payload: {details}"))

    @app.exception_handler(StoreError)
    def _redis_down(exc: StoreError) -> Response[str]:
        return text(503, storage_unavailable(exc))


def openapi_document(app: APIGatewayRestResolver | None = None) -> str:
    """The OpenAPI 3.1 document of a bus resolver (JSON); without ``app``, of one on a store it never
    calls (the document depends on the routes alone)."""
    from aws_lambda_powertools.event_handler.openapi.models import HTTPBase

    if app is None:
        import redis

        from switchyard.bus.settings import BusSettings
        from switchyard.bus.store import BusStore

        store = BusStore(redis.Redis(), BusSettings())
        credentials = Credentials(store)
        app = build_resolver(store, credentials, Publisher(store, credentials))
    return app.get_openapi_json_schema(
        title="Switchyard event bus", version=__version__,
        description="Routemaster's API (HTTP Basic: the username is an API token, the password is ignored).",
        security_schemes={"basic": HTTPBase(scheme="basic")}, security=[{"basic": []}])
