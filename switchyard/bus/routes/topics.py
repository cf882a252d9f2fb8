"""The bus API's topic routes: list topics, publish an event (the first publisher claims the topic),
delete a topic."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Path
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from switchyard.bus.errors import TopicClaimedError, UnauthorizedError, UnknownTokenError
from switchyard.bus.models import TOPIC_PATTERN, EventIn
from switchyard.bus.publish import header_traceparent
from switchyard.bus.routes.common import BusRequest, display_token, json_answer, text


def router(bus: BusRequest) -> APIGatewayRouter:
    routes = APIGatewayRouter()
    store = bus.store

    @routes.get("/topics", summary="every topic, its publisher and events ever published")
    def list_topics() -> Response[str]:
        who = bus.require("client", "root")
        names = store.tokens()
        topics = store.topics()
        for t in topics:
            t["publisher"] = display_token(t["publisher"], who, names)
        return json_answer(200, topics)

    @routes.post("/topics/<name>", summary="publish an event; the first publisher claims the topic",
                 responses={200: {"description": "accepted"},
                            403: {"description": "topic claimed by another client"}})
    def publish(name: Annotated[str, Path(pattern=TOPIC_PATTERN)], body: EventIn) -> Response[str]:
        token = bus.basic()  # the ingest script checks it: one round trip per publish
        if token is None or bus.credentials.is_root(token):
            raise UnauthorizedError(("client",))
        bus.object_body("bad event")
        try:
            bus.publisher.accept(name, token, body, header_traceparent(bus.app.current_event.headers))
        except UnknownTokenError:
            raise UnauthorizedError(("client",)) from None
        except TopicClaimedError:
            return text(403, "topic claimed")
        return text(200)

    @routes.delete("/topics/<name>", summary="delete a topic (its publisher, or root; an unclaimed topic "
                   "also the client whose subscription created it); subscriptions to it go",
                   responses={204: {"description": "deleted"}, 403: {"description": "not the publisher"},
                              404: {"description": "no such topic"}})
    def delete_topic(name: str) -> Response[str]:
        kind, token = bus.require("client", "root")
        done = store.delete_topic(name, token if kind == "client" else None)
        if done == 0:
            return text(404, "topic not found")
        if done < 0:
            return text(403, "only the topic's publisher may delete it")
        return text(204)

    return routes
