"""What every route module of the bus API shares: the answers (Routemaster's refusals are text), the
views of a token or a callback another client may see, and ``BusRequest``: one bus's store and
credentials, with the checks a route makes of the request in hand."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response

from switchyard.bus.auth import Caller, Credentials, basic_username
from switchyard.bus.errors import BadInputError, StoreError, UnauthorizedError
from switchyard.bus.ports import BusStorePort
from switchyard.bus.publish import Publisher
from switchyard.core.observability import logger


def text(status: int, message: str = "") -> Response[str]:
    """A text/plain answer (Routemaster's refusals are text)."""
    return Response(status_code=status, content_type="text/plain", body=message)


def json_answer(status: int, payload: Any) -> Response[str]:
    return Response(status_code=status, content_type="application/json", body=json.dumps(payload))


def unauthorized_text(exc: UnauthorizedError) -> str:
    """What a 401 says, from the fast checks and the resolver alike."""
    return f"this endpoint requires authentication with {exc}"


def storage_unavailable(exc: StoreError) -> str:
    """Log a Redis error; the message a 503 says."""
    logger.warning("bus API: Redis error", extra={"error": str(exc)})
    return "storage unavailable"


def display_token(token: str | None, who: Caller, names: dict[str, str]) -> str | None:
    """A token as another client may see it: its client name (tokens are credentials)."""
    if token is None or who[0] == "root" or token == who[1]:
        return token
    return names.get(token, "revoked")


def strip_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


class BusRequest:
    """One bus behind one resolver: what its routes use, and the checks of the request in hand."""

    def __init__(self, app: APIGatewayRestResolver, store: BusStorePort, credentials: Credentials,
                 publisher: Publisher) -> None:
        self.app, self.store, self.credentials, self.publisher = app, store, credentials, publisher

    def basic(self) -> str | None:
        return basic_username(self.app.current_event.headers.get("authorization"))

    def caller(self) -> Caller | None:
        return self.credentials.who(self.basic())

    def require(self, *kinds: str) -> Caller:
        who = self.caller()
        if who is None or who[0] not in kinds:
            raise UnauthorizedError(kinds)
        return who

    def object_body(self, message: str) -> None:
        """The JSON body must be one object: Powertools' validation takes ``[x]`` for ``x``."""
        if not isinstance(self.app.current_event.json_body, dict):
            raise BadInputError(message)
