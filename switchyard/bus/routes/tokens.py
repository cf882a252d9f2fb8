"""The bus API's token routes (root only): list, register and revoke clients."""

from __future__ import annotations

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from switchyard.bus.models import TokenIn
from switchyard.bus.routes.common import BusRequest, json_answer, text


def router(bus: BusRequest) -> APIGatewayRouter:
    routes = APIGatewayRouter()
    store = bus.store

    @routes.get("/api_tokens", summary="list client tokens (root)",
                responses={204: {"description": "no tokens yet"}})
    def list_tokens() -> Response[str]:
        bus.require("root")
        tokens = store.tokens()
        if not tokens:
            return text(204)
        return json_answer(200, [{"name": name, "token": token} for token, name in sorted(tokens.items())])

    @routes.post("/api_tokens", summary="register a client (root)",
                 responses={201: {"description": "created"}})
    def create_token(body: TokenIn) -> Response[str]:
        bus.require("root")
        bus.object_body("bad data in payload: not a JSON object")
        try:
            token = store.create_token(body.name, body.token)
        except ValueError as exc:
            return text(400, str(exc))
        return json_answer(201, {"token": token, "name": body.name})

    @routes.delete("/api_tokens/<token>", summary="revoke a token and remove its subscriber (root)",
                   responses={204: {"description": "revoked (or never existed)"}})
    def delete_token(token: str) -> Response[str]:
        bus.require("root")
        store.delete_token(token)
        return text(204)

    return routes
