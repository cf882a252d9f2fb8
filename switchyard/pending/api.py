"""The node API for polling services: HTTP long poll, one Powertools REST resolver for both hosts.

``switchyard pending serve`` runs it locally (``switchyard.local.http_gateway``); on AWS the same
resolver is the Lambda behind API Gateway (``functions/pending_api.py``). Routes, each under
``/endpoints/{endpoint}/`` and authenticated by that endpoint's token (``Authorization: Bearer``):

* ``GET next?wait=S``: the next request (200, JSON) or 204 after up to ``S`` seconds (at most
  ``SWITCHYARD_PENDING_HTTP_POLL_WAIT``, and never past the Lambda's remaining time: the long poll
  ends inside API Gateway's 29 s);
* ``POST requests/{id}/heartbeat`` ``{"take": T}``: the service is alive; the reply says whether
  to stop (``{"cancelled": bool, "reason": str|null}``);
* ``POST requests/{id}/response`` ``{"take": T, "ok": true, "body": ..., "streams": [...]}`` or
  ``{"take": T, "ok": false, "error": "..."}``: the answer (``{"delivery": "delivered"|...}``).

Errors are JSON ``{"statusCode": n, "message": "..."}``: 401 missing/wrong token, 404 unknown
endpoint, 400 malformed JSON or fields, 413 body over the message limit, 409 a take that no longer
holds the request, 503 Redis unreachable (or refusing the command).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.api_gateway import BaseRouter
from aws_lambda_powertools.event_handler.exceptions import (
    BadRequestError,
    NotFoundError,
    RequestEntityTooLargeError,
    UnauthorizedError,
)

from switchyard.errors import ConfigError
from switchyard.pending.errors import MessageTooLargeError, PendingError
from switchyard.pending.queue import ID_LENGTH, Delivery, PendingQueue
from switchyard.pending.settings import ENDPOINT_NAME
from switchyard.pending.storage import StreamError, StreamRef

# Time kept back from the Lambda's remaining time so a long poll answers before it is cut off.
LAMBDA_MARGIN_MS = 2_000
# JSON framing around a message (take id, ok flag) on top of the message size limit.
ENVELOPE_BYTES = 4096
TOKENS_REFRESH_S = 300.0


class TokenStore:
    """Endpoint -> token, from ``SWITCHYARD_PENDING_TOKENS`` (a JSON object) locally, or from a JSON
    secret (``SWITCHYARD_PENDING_TOKENS_SECRET_ARN``) re-read every 5 minutes on AWS, so a rotated
    token takes effect without a deploy."""

    def __init__(self, load: Callable[[], Mapping[str, str]], refresh_s: float = TOKENS_REFRESH_S) -> None:
        self._load, self._refresh_s = load, refresh_s
        self._lock = threading.Lock()
        self._digests: dict[str, bytes] = {}
        self._loaded_at = float("-inf")

    @classmethod
    def static(cls, tokens: Mapping[str, str]) -> TokenStore:
        return cls(lambda: tokens, refresh_s=float("inf"))

    @classmethod
    def from_env(cls) -> TokenStore:
        arn = os.environ.get("SWITCHYARD_PENDING_TOKENS_SECRET_ARN")
        if arn:
            from switchyard.aws_secrets import _fetch

            return cls(lambda: _fetch(arn))
        raw = os.environ.get("SWITCHYARD_PENDING_TOKENS", "")
        try:
            tokens = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ConfigError(f"SWITCHYARD_PENDING_TOKENS is not JSON: {exc}") from exc
        if not isinstance(tokens, dict) or not all(isinstance(v, str) and v for v in tokens.values()):
            raise ConfigError('SWITCHYARD_PENDING_TOKENS must be a JSON object {"endpoint": "token", ...}')
        return cls.static(tokens)

    def _current(self) -> dict[str, bytes]:
        with self._lock:
            if time.monotonic() - self._loaded_at >= self._refresh_s:
                self._digests = {e: hashlib.sha256(t.encode()).digest() for e, t in self._load().items()}
                self._loaded_at = time.monotonic()
            return self._digests

    def endpoints(self) -> list[str]:
        return sorted(self._current())

    def known(self, endpoint: str) -> bool:
        return endpoint in self._current()

    def check(self, endpoint: str, token: str) -> bool:
        """Constant-time comparison of digests (no timing hint about the token)."""
        expected = self._current().get(endpoint)
        return expected is not None and hmac.compare_digest(expected, hashlib.sha256(token.encode()).digest())


def _json_body(app: APIGatewayRestResolver, limit: int) -> dict[str, Any]:
    event = app.current_event
    raw = event.decoded_body or ""
    if len(raw.encode() if isinstance(raw, str) else raw) > limit:
        raise RequestEntityTooLargeError(f"body over {limit} bytes; send large data as streams")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequestError(f"malformed JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequestError("the body must be a JSON object")
    take = body.get("take")
    if not isinstance(take, str) or not take.isalnum():
        raise BadRequestError('"take" (the take id the request came with) is required')
    return body


class TurnTakingResolver(APIGatewayRestResolver):
    """A resolver that several server threads may share, long polls included.

    Powertools keeps the request being resolved in class attributes (``BaseRouter.current_event``,
    ``lambda_context``) and the matched route in the instance's ``context``: one request per
    process, as in a Lambda environment. Shared by the local gateway's threads, a request could
    read another's headers (its token) or route. So requests take turns; a route that waits
    (the long poll) hands the turn back for the wait with ``waiting()``, and gets its own request
    back before it continues.
    """

    def __init__(self) -> None:
        super().__init__()
        self._turn = threading.Lock()

    def resolve(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        with self._turn:
            return super().resolve(event, context)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Inside a route: let other requests be resolved while this one blocks."""
        saved = BaseRouter.current_event, BaseRouter.lambda_context, dict(self.context)
        self._turn.release()
        try:
            yield
        finally:
            self._turn.acquire()
            BaseRouter.current_event, BaseRouter.lambda_context = saved[0], saved[1]
            self.context.clear()
            self.context.update(saved[2])


def build_app(queue: PendingQueue, tokens: TokenStore) -> TurnTakingResolver:
    """The resolver, bound to one node's queue and an endpoint token store."""
    app = TurnTakingResolver()
    settings = queue.settings
    body_limit = settings.max_message_bytes + ENVELOPE_BYTES

    def authorize(endpoint: str, request_id: str | None = None) -> None:
        if not ENDPOINT_NAME.match(endpoint) or not tokens.known(endpoint):
            raise NotFoundError(f"unknown endpoint {endpoint!r}")
        headers = app.current_event.headers
        header = headers.get("Authorization") or headers.get("authorization")
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token or not tokens.check(endpoint, token.strip()):
            raise UnauthorizedError(f"missing or wrong token for endpoint {endpoint!r}")
        if request_id is not None and not (len(request_id) == ID_LENGTH and request_id.isalnum()):
            raise NotFoundError(f"no request {request_id!r}")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "node": queue.node_id}

    @app.get("/endpoints/<endpoint>/next")
    def next_request(endpoint: str) -> Response | dict[str, Any]:
        authorize(endpoint)
        raw_wait = app.current_event.get_query_string_value("wait", str(settings.http_poll_wait_s))
        try:
            wait = min(float(raw_wait), settings.http_poll_wait_s)
        except ValueError as exc:
            raise BadRequestError(f"wait must be a number of seconds, got {raw_wait!r}") from exc
        context = app.lambda_context
        if context is not None:
            wait = min(wait, (context.get_remaining_time_in_millis() - LAMBDA_MARGIN_MS) / 1000)
        with app.waiting():
            request = queue.dequeue(endpoint, max(0.0, wait), track=False)
        if request is None:
            return Response(status_code=204, body="")
        return request.to_json()

    @app.post("/endpoints/<endpoint>/requests/<request_id>/heartbeat")
    def heartbeat(endpoint: str, request_id: str) -> dict[str, Any]:
        authorize(endpoint, request_id)
        body = _json_body(app, ENVELOPE_BYTES)
        beat = queue.processor_heartbeat(endpoint, request_id, body["take"])
        return {"cancelled": beat.cancelled, "reason": beat.reason}

    @app.post("/endpoints/<endpoint>/requests/<request_id>/response")
    def response(endpoint: str, request_id: str) -> Response | dict[str, Any]:
        authorize(endpoint, request_id)
        body = _json_body(app, body_limit)
        if not isinstance(body.get("ok"), bool):
            raise BadRequestError('"ok" must be true or false')
        if body["ok"]:
            try:
                streams = [StreamRef.from_json(s).to_json() for s in body.get("streams") or []]
            except StreamError as exc:
                raise BadRequestError(str(exc)) from exc
            message: dict[str, Any] = {"ok": True, "body": body.get("body"), "streams": streams}
        else:
            message = {"ok": False, "error": str(body.get("error") or "the service failed")}
        try:
            delivery = queue.respond(endpoint, request_id, body["take"], message)
        except MessageTooLargeError as exc:
            raise RequestEntityTooLargeError(str(exc)) from exc
        if delivery is Delivery.NOT_TAKER:
            return Response(status_code=409, content_type="application/json",
                            body=json.dumps({"statusCode": 409, "delivery": delivery.value,
                                             "message": "this take no longer holds the request"}))
        return {"delivery": delivery.value}

    @app.exception_handler(PendingError)  # QueueUnavailableError, or Redis refusing (WRONGTYPE, OOM)
    def unavailable(exc: PendingError) -> Response:
        return Response(status_code=503, content_type="application/json",
                        body=json.dumps({"statusCode": 503, "message": str(exc)}))

    @app.exception_handler(ValueError)
    def bad_value(exc: ValueError) -> Response:
        return Response(status_code=400, content_type="application/json",
                        body=json.dumps({"statusCode": 400, "message": str(exc)}))

    return app

