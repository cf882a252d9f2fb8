"""The bus API's health routes: liveness without authentication, and Redis's pulse."""

from __future__ import annotations

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from switchyard.bus.errors import StoreError
from switchyard.bus.routes.common import BusRequest, json_answer, text


def router(bus: BusRequest) -> APIGatewayRouter:
    routes = APIGatewayRouter()

    @routes.get("/health", summary="liveness, without authentication")
    def health() -> Response[str]:
        return json_answer(200, {})

    @routes.get("/pulse", summary="204 when Redis answers", responses={204: {"description": "Redis answers"}})
    def pulse() -> Response[str]:
        bus.require("root", "client")
        try:
            bus.store.ping()
        except StoreError:
            return text(500)
        return text(204)

    return routes
