"""One bus's HTTP API as a Lambda proxy handler: ``build_app(store)`` wires the credentials, the
publish fast path and the resolver's routes, and ``BusApp.resolve`` is the entry point (API Gateway
+ Lambda in ``functions/bus_api.py``; ``switchyard bus serve`` through ``switchyard.local.http_gateway``,
which takes anything with ``resolve``)."""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from switchyard.bus.auth import ANYONE, Credentials, header_username
from switchyard.bus.errors import StoreError
from switchyard.bus.ports import BusStorePort
from switchyard.bus.publish import Publisher, proxy_text
from switchyard.bus.routes import build_resolver, storage_unavailable, unauthorized_text

# Powertools keeps the request being resolved in class attributes (``BaseRouter.current_event``,
# shared by every resolver of the process), as Lambda runs one request at a time per environment;
# a threaded local server, or several apps in one process, must take turns process-wide.
_one_request_at_a_time = threading.Lock()
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_TOO_DEEP = "bad data in payload: JSON nested too deeply"


def _without_content_type(headers: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (headers or {}).items() if k.lower() != "content-type"}


class BusApp:
    """The API of one bus: ``resolve(event, context)`` answers a Lambda proxy event."""

    def __init__(self, store: BusStorePort) -> None:
        self.store = store
        self.credentials = Credentials(store)
        self.publisher = Publisher(store, self.credentials)
        self.resolver: APIGatewayRestResolver = build_resolver(store, self.credentials, self.publisher)

    def fast_publish(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """An accepted publish without the resolver (``publish.Publisher.fast_publish``), else None."""
        return self.publisher.fast_publish(event)

    def resolve(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        """An accepted publish by the fast path, anything else by the resolver with every body read
        as JSON text, whatever its Content-Type (as Routemaster's parser does: ``curl -d`` sends
        form-urlencoded, and Powertools would parse a form, or fail on a multipart type without a
        boundary). A body that is not UTF-8 becomes invalid JSON, refused like any other (401 or
        400), not a handler crash. A POST (every route with a body) is authenticated before its body
        is parsed, and JSON too deeply nested to parse is a 400."""
        if _CONTROL_CHARS.search(event.get("path") or ""):
            # Powertools' route patterns end in ``$``, which matches before a final newline: without
            # this ``POST /topics/fast%0A`` would publish to topic ``fast``.
            return proxy_text(400, "bad path: control characters")
        accepted = self.fast_publish(event)
        if accepted is not None:
            return accepted
        body = event.get("body")
        if body:
            if event.get("isBase64Encoded"):
                try:
                    body = base64.b64decode(body).decode("utf-8")
                except (binascii.Error, UnicodeDecodeError):
                    body = "<a body that is not UTF-8>"
            headers = _without_content_type(event.get("headers"))
            multi = _without_content_type(event.get("multiValueHeaders"))
            event = {**event, "body": body, "isBase64Encoded": False,
                     "headers": {**headers, "Content-Type": "application/json"},
                     "multiValueHeaders": {**multi, "Content-Type": ["application/json"]}}
            if event.get("httpMethod") == "POST":
                refused = self._refuse_before_parsing(event, body)
                if refused is not None:
                    return refused
        with _one_request_at_a_time:
            return self.resolver.resolve(event, context)

    def _refuse_before_parsing(self, event: dict[str, Any], body: str) -> dict[str, Any] | None:
        """401 for a body without a valid credential (it is never parsed), 400 for JSON nested too
        deeply to parse (an uncaught RecursionError was a 502 with a traceback), else None."""
        try:
            who = self.credentials.who(header_username(event.get("headers")))
        except StoreError as exc:  # as the resolver's handler answers it
            return proxy_text(503, storage_unavailable(exc))
        if who is None:
            return {**proxy_text(401, unauthorized_text(ANYONE)),
                    "multiValueHeaders": {"Content-Type": ["text/plain"], "WWW-Authenticate": ["Basic"]}}
        try:
            json.loads(body)
        except RecursionError:
            return proxy_text(400, _TOO_DEEP)
        except ValueError:
            pass  # the resolver refuses it with its own message
        return None


def build_app(store: BusStorePort) -> BusApp:
    """The API of the bus ``store`` holds (a process builds it once: ``service.BusService.app``)."""
    return BusApp(store)
