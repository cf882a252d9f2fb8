"""The bus API's routes: Routemaster's endpoints on one Powertools REST resolver, with request
validation, its exception handlers (Routemaster's status codes) and an OpenAPI document. Every
refusal is answered here, the fast path's too (``publish.fast_publish`` declines them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import urlsplit

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Path
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse

from switchyard import __version__
from switchyard.bus.auth import ANYONE, Caller, Credentials, basic_username
from switchyard.bus.errors import (
    BadInputError,
    StoreError,
    TopicClaimedError,
    TopicLimitError,
    UnauthorizedError,
    UnknownTokenError,
)
from switchyard.bus.models import TOPIC_PATTERN, EventIn, SubscriptionBody, TokenIn, subscription_model
from switchyard.bus.ports import BusStorePort
from switchyard.bus.publish import Publisher, header_traceparent
from switchyard.core.observability import logger, redact

_UNSUBSCRIBE_ERRORS = {-1: "subscriber not found", -2: "topic not found", -3: "not subscribed"}
_SUBSCRIBED: dict[int, OpenAPIResponse] = {204: {"description": "subscribed"},
               403: {"description": "too many unclaimed topics created by this client"}}


def text(status: int, message: str = "") -> Response[str]:
    """A text/plain answer (Routemaster's refusals are text)."""
    return Response(status_code=status, content_type="text/plain", body=message)


def _json(status: int, payload: Any) -> Response[str]:
    return Response(status_code=status, content_type="application/json", body=json.dumps(payload))


def unauthorized_text(exc: UnauthorizedError) -> str:
    """What a 401 says, from the fast checks and the resolver alike."""
    return f"this endpoint requires authentication with {exc}"


def storage_unavailable(exc: StoreError) -> str:
    """Log a Redis error; the message a 503 says."""
    logger.warning("bus API: Redis error", extra={"error": str(exc)})
    return "storage unavailable"


def _display_token(token: str | None, who: Caller, names: dict[str, str]) -> str | None:
    """A token as another client may see it: its client name (tokens are credentials)."""
    if token is None or who[0] == "root" or token == who[1]:
        return token
    return names.get(token, "revoked")


def _strip_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def build_resolver(store: BusStorePort, credentials: Credentials,
                   publisher: Publisher) -> APIGatewayRestResolver:
    """The resolver of one bus: every route, bound to its store."""
    app = APIGatewayRestResolver(enable_validation=True)
    subscription_in = subscription_model(store.settings)

    def with_subscription(route: Callable[..., Response[str]]) -> Callable[..., Response[str]]:
        """``body`` is this bus's ``SubscriptionIn`` (a local class: a string annotation, as this
        module's are, would not resolve)."""
        route.__annotations__["body"] = subscription_in
        return route

    def basic() -> str | None:
        return basic_username(app.current_event.headers.get("authorization"))

    def caller() -> Caller | None:
        return credentials.who(basic())

    def require(*kinds: str) -> Caller:
        who = caller()
        if who is None or who[0] not in kinds:
            raise UnauthorizedError(kinds)
        return who

    def object_body(message: str) -> None:
        """The JSON body must be one object: Powertools' validation takes ``[x]`` for ``x``."""
        if not isinstance(app.current_event.json_body, dict):
            raise BadInputError(message)

    @app.exception_handler(UnauthorizedError)
    def _unauthorized(exc: UnauthorizedError) -> Response[str]:
        return Response(status_code=401, content_type="text/plain", headers={"WWW-Authenticate": "Basic"},
                        body=unauthorized_text(exc))

    @app.exception_handler(BadInputError)
    def _bad_input(exc: BadInputError) -> Response[str]:
        if caller() is None:  # authentication first, whatever is wrong with the input
            return _unauthorized(ANYONE)
        return text(400, str(exc))

    @app.exception_handler(RequestValidationError)
    def _invalid(exc: RequestValidationError) -> Response[str]:
        """Bad input is 400 (Routemaster's code), once the caller has shown a valid credential."""
        if caller() is None:
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

    # -- health --------------------------------------------------------------------------------

    @app.get("/health", summary="liveness, without authentication")
    def health() -> Response[str]:
        return _json(200, {})

    @app.get("/pulse", summary="204 when Redis answers", responses={204: {"description": "Redis answers"}})
    def pulse() -> Response[str]:
        require("root", "client")
        try:
            store.ping()
        except StoreError:
            return text(500)
        return text(204)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> Response[str]:
        return _json(200, json.loads(openapi_document(app)))

    # -- tokens (root) -------------------------------------------------------------------------

    @app.get("/api_tokens", summary="list client tokens (root)",
             responses={204: {"description": "no tokens yet"}})
    def list_tokens() -> Response[str]:
        require("root")
        tokens = store.tokens()
        if not tokens:
            return text(204)
        return _json(200, [{"name": name, "token": token} for token, name in sorted(tokens.items())])

    @app.post("/api_tokens", summary="register a client (root)", responses={201: {"description": "created"}})
    def create_token(body: TokenIn) -> Response[str]:
        require("root")
        object_body("bad data in payload: not a JSON object")
        try:
            token = store.create_token(body.name, body.token)
        except ValueError as exc:
            return text(400, str(exc))
        return _json(201, {"token": token, "name": body.name})

    @app.delete("/api_tokens/<token>", summary="revoke a token and remove its subscriber (root)",
                responses={204: {"description": "revoked (or never existed)"}})
    def delete_token(token: str) -> Response[str]:
        require("root")
        store.delete_token(token)
        return text(204)

    # -- topics --------------------------------------------------------------------------------

    @app.get("/topics", summary="every topic, its publisher and events ever published")
    def list_topics() -> Response[str]:
        who = require("client", "root")
        names = store.tokens()
        topics = store.topics()
        for t in topics:
            t["publisher"] = _display_token(t["publisher"], who, names)
        return _json(200, topics)

    @app.post("/topics/<name>", summary="publish an event; the first publisher claims the topic",
              responses={200: {"description": "accepted"},
                         403: {"description": "topic claimed by another client"}})
    def publish(name: Annotated[str, Path(pattern=TOPIC_PATTERN)], body: EventIn) -> Response[str]:
        token = basic()  # the ingest script checks it: one round trip per publish
        if token is None or credentials.is_root(token):
            raise UnauthorizedError(("client",))
        object_body("bad event")
        try:
            publisher.accept(name, token, body, header_traceparent(app.current_event.headers))
        except UnknownTokenError:
            raise UnauthorizedError(("client",)) from None
        except TopicClaimedError:
            return text(403, "topic claimed")
        return text(200)

    @app.delete("/topics/<name>", summary="delete a topic (its publisher, or root; an unclaimed topic also "
                "the client whose subscription created it); subscriptions to it go",
                responses={204: {"description": "deleted"}, 403: {"description": "not the publisher"},
                           404: {"description": "no such topic"}})
    def delete_topic(name: str) -> Response[str]:
        kind, token = require("client", "root")
        done = store.delete_topic(name, token if kind == "client" else None)
        if done == 0:
            return text(404, "topic not found")
        if done < 0:
            return text(403, "only the topic's publisher may delete it")
        return text(204)

    # -- subscriptions -------------------------------------------------------------------------

    def _subscribe(body: SubscriptionBody) -> Response[str]:
        _, token = require("client")
        object_body("bad data in payload: not a JSON object")
        try:
            store.subscribe(token, body.topics, body.callback, body.uuid, body.max, body.timeout,
                            registered=True)
        except UnknownTokenError:
            raise UnauthorizedError(("client",)) from None
        except TopicLimitError as exc:
            return text(403, str(exc))
        return text(204)

    @app.post("/subscription", summary="subscribe (the whole subscription: unlisted topics are left)",
              responses=_SUBSCRIBED)
    @with_subscription
    def subscribe(body: SubscriptionBody) -> Response[str]:
        return _subscribe(body)

    @app.post("/subscriber", summary="alias of POST /subscription", responses=_SUBSCRIBED)
    @with_subscription
    def subscribe_alias(body: SubscriptionBody) -> Response[str]:
        return _subscribe(body)

    @app.delete("/subscriber", summary="unsubscribe from everything and drop queued events",
                responses={204: {"description": "deleted"}, 404: {"description": "not subscribed"}})
    def delete_subscriber() -> Response[str]:
        _, token = require("client")  # root has none: DELETE /api_tokens/:token removes a client's
        if not store.delete_subscriber(token):
            return text(404, "subscriber not found")
        return text(204)

    @app.delete("/subscriber/topics/<name>", summary="unsubscribe from one topic",
                responses={204: {"description": "unsubscribed"}, 404: {"description": "not found"}})
    def unsubscribe(name: str) -> Response[str]:
        _, token = require("client")
        done = store.unsubscribe(token, name)
        if done < 0:
            return text(404, _UNSUBSCRIBE_ERRORS[done])
        return text(204)

    def _subscriptions() -> Response[str]:
        who = require("root", "client")
        names = store.tokens()
        out = []
        for token in store.subscriber_tokens():
            sub = store.subscriber(token, with_topics=True)
            if sub is None:
                continue
            queued, oldest = store.queued(token)
            own = who == ("client", token)
            out.append({
                "subscriber": _display_token(token, who, names),
                "uuid": sub.uuid if own else None,
                "callback": sub.callback if own or who[0] == "root" else _strip_userinfo(sub.callback),
                "max_events": sub.max_events,
                "timeout": sub.timeout_ms,
                "topics": list(sub.topics),
                "health_points": sub.health_points,
                "events": {"sent": None, "queued": queued, "oldest": oldest},
            })
        return _json(200, out)

    @app.get("/subscriptions", summary="every subscription (uuid only to its own subscriber)")
    def subscriptions() -> Response[str]:
        return _subscriptions()

    @app.get("/subscribers", summary="alias of GET /subscriptions")
    def subscribers() -> Response[str]:
        return _subscriptions()

    return app


def openapi_document(app: APIGatewayRestResolver) -> str:
    """The OpenAPI 3.1 document of a bus resolver (JSON)."""
    from aws_lambda_powertools.event_handler.openapi.models import HTTPBase

    return app.get_openapi_json_schema(
        title="Switchyard event bus", version=__version__,
        description="Routemaster's API (HTTP Basic: the username is an API token, the password is ignored).",
        security_schemes={"basic": HTTPBase(scheme="basic")}, security=[{"basic": []}])
