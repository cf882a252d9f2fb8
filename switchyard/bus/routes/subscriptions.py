"""The bus API's subscription routes: subscribe (the whole subscription), unsubscribe from one
topic or from everything, and list subscriptions (a subscriber's ``uuid`` only to itself)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from switchyard.bus.errors import TopicLimitError, UnauthorizedError, UnknownTokenError
from switchyard.bus.models import SubscriptionBody, subscription_model
from switchyard.bus.routes.common import BusRequest, display_token, json_answer, strip_userinfo, text

_UNSUBSCRIBE_ERRORS = {-1: "subscriber not found", -2: "topic not found", -3: "not subscribed"}
_SUBSCRIBED: dict[int, OpenAPIResponse] = {204: {"description": "subscribed"},
               403: {"description": "too many unclaimed topics created by this client"}}


def router(bus: BusRequest) -> APIGatewayRouter:
    routes = APIGatewayRouter()
    store = bus.store
    subscription_in = subscription_model(store.settings)

    def with_subscription(route: Callable[..., Response[str]]) -> Callable[..., Response[str]]:
        """``body`` is this bus's ``SubscriptionIn`` (a local class: a string annotation, as this
        module's are, would not resolve)."""
        route.__annotations__["body"] = subscription_in
        return route

    def _subscribe(body: SubscriptionBody) -> Response[str]:
        _, token = bus.require("client")
        bus.object_body("bad data in payload: not a JSON object")
        try:
            store.subscribe(token, body.topics, body.callback, body.uuid, body.max, body.timeout,
                            registered=True)
        except UnknownTokenError:
            raise UnauthorizedError(("client",)) from None
        except TopicLimitError as exc:
            return text(403, str(exc))
        return text(204)

    @routes.post("/subscription", summary="subscribe (the whole subscription: unlisted topics are left)",
                 responses=_SUBSCRIBED)
    @with_subscription
    def subscribe(body: SubscriptionBody) -> Response[str]:
        return _subscribe(body)

    @routes.post("/subscriber", summary="alias of POST /subscription", responses=_SUBSCRIBED)
    @with_subscription
    def subscribe_alias(body: SubscriptionBody) -> Response[str]:
        return _subscribe(body)

    @routes.delete("/subscriber", summary="unsubscribe from everything and drop queued events",
                   responses={204: {"description": "deleted"}, 404: {"description": "not subscribed"}})
    def delete_subscriber() -> Response[str]:
        _, token = bus.require("client")  # root has none: DELETE /api_tokens/:token removes a client's
        if not store.delete_subscriber(token):
            return text(404, "subscriber not found")
        return text(204)

    @routes.delete("/subscriber/topics/<name>", summary="unsubscribe from one topic",
                   responses={204: {"description": "unsubscribed"}, 404: {"description": "not found"}})
    def unsubscribe(name: str) -> Response[str]:
        _, token = bus.require("client")
        done = store.unsubscribe(token, name)
        if done < 0:
            return text(404, _UNSUBSCRIBE_ERRORS[done])
        return text(204)

    @routes.get("/subscriptions", summary="every subscription (uuid only to its own subscriber)")
    def subscriptions() -> Response[str]:
        return json_answer(200, _listing(bus))

    @routes.get("/subscribers", summary="alias of GET /subscriptions")
    def subscribers() -> Response[str]:
        return json_answer(200, _listing(bus))

    return routes


def _listing(bus: BusRequest) -> list[dict[str, Any]]:
    who = bus.require("root", "client")
    store = bus.store
    names = store.tokens()
    out = []
    for token in store.subscriber_tokens():
        sub = store.subscriber(token, with_topics=True)
        if sub is None:
            continue
        queued, oldest = store.queued(token)
        own = who == ("client", token)
        out.append({
            "subscriber": display_token(token, who, names),
            "uuid": sub.uuid if own else None,
            "callback": sub.callback if own or who[0] == "root" else strip_userinfo(sub.callback),
            "max_events": sub.max_events,
            "timeout": sub.timeout_ms,
            "topics": list(sub.topics),
            "health_points": sub.health_points,
            "events": {"sent": None, "queued": queued, "oldest": oldest},
        })
    return out
