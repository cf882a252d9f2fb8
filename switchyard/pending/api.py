"""The node API for polling services: HTTP long poll, one Powertools REST resolver for both hosts.

``switchyard pending serve`` runs it locally (``switchyard.local.http_gateway``); on AWS the same
resolver is the Lambda behind API Gateway (``functions/pending_api.py``). Routes, each under
``/endpoints/{endpoint}/`` and authenticated by that endpoint's token (``Authorization: Bearer``):

* ``GET next?wait=S``: the next request (200, JSON) or 204 after up to ``S`` seconds (at most
  ``SWITCHYARD_PENDING_HTTP_POLL_WAIT_S``, and never past the Lambda's remaining time: the long poll
  ends inside API Gateway's 29 s);
* ``POST requests/{id}/heartbeat`` ``{"take": T}``: the service is alive; the reply says whether
  to stop (``{"cancelled": bool, "reason": str|null}``);
* ``POST requests/{id}/response`` ``{"take": T, "ok": true, "body": ..., "streams": [...]}`` or
  ``{"take": T, "ok": false, "error": "..."}``: the answer (``{"delivery": "delivered"|...}``).

Errors are JSON ``{"statusCode": n, "message": "..."}``: 401 missing/wrong token (an unknown
endpoint answers the same: names cannot be enumerated), 400 malformed JSON (nested too deeply too)
or fields, 413 body over the message limit, 409 a take that does not hold the request (stale, or a
request id that is not this endpoint's: nothing is said about other endpoints' requests), 429 more
than ``SWITCHYARD_PENDING_MAX_POLLS`` long polls of the endpoint waiting already (``Retry-After``),
503 Redis unreachable (or refusing the command). A body is read only after the token is checked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.api_gateway import BaseRouter
from aws_lambda_powertools.event_handler.exceptions import (
    BadRequestError,
    NotFoundError,
    RequestEntityTooLargeError,
    ServiceError,
    UnauthorizedError,
)
from aws_lambda_powertools.event_handler.openapi.params import Body, Query

from switchyard.core.errors import ConfigError
from switchyard.pending import openapi as doc
from switchyard.pending.errors import MessageTooLargeError, PendingError, StreamError
from switchyard.pending.model import ID_LENGTH, Delivery
from switchyard.pending.service import PendingQueue
from switchyard.pending.settings import ENDPOINT_NAME, PENDING, TOKENS, token_sources
from switchyard.pending.streams import StreamRef

# Time kept back from the Lambda's remaining time so a long poll answers before it is cut off.
LAMBDA_MARGIN_MS = 2_000
# JSON framing around a message (take id, ok flag) on top of the message size limit.
ENVELOPE_BYTES = 4096
TOKENS_REFRESH_S = 300.0
# A poll slot outlives its poll by this much: a node that dies holding one frees it this late.
POLL_SLOT_GRACE_S = 5.0
NOT_HELD = "this take does not hold the request"
# What the queue's processor heartbeat says when the take does not hold the request, or the request
# is not in this endpoint's keys (expired, or another endpoint's id): answered alike, as NOT_HELD.
_NOT_HELD_REASONS = frozenset({"this take no longer holds the request",
                               "the request is gone from Redis (expired)"})
_NO_DIGEST = hashlib.sha256(b"").digest()
# The default of a route's documented body parameter: without validation Powertools never fills it
# in, and the route reads its body itself (switchyard.pending.openapi says why).
_READ_BY_ROUTE: Any = None


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
        arn, raw = token_sources()
        if arn:
            from switchyard.core.aws_secrets import fetch_secret

            return cls(lambda: fetch_secret(arn))
        try:
            tokens = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ConfigError(f"{TOKENS.name} is not JSON: {exc}") from exc
        if not isinstance(tokens, dict) or not all(isinstance(v, str) and v for v in tokens.values()):
            raise ConfigError(f'{TOKENS.name} must be a JSON object {{"endpoint": "token", ...}}')
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
        """Constant-time comparison of digests (no timing hint about the token, nor about whether the
        endpoint exists: an unknown one is compared too)."""
        expected = self._current().get(endpoint)
        matches = hmac.compare_digest(expected or _NO_DIGEST, hashlib.sha256(token.encode()).digest())
        return expected is not None and matches


def _json_body(app: APIGatewayRestResolver, limit: int) -> dict[str, Any]:
    event = app.current_event
    raw = event.decoded_body or ""
    if len(raw.encode() if isinstance(raw, str) else raw) > limit:
        raise RequestEntityTooLargeError(f"body over {limit} bytes; send large data as streams")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequestError(f"malformed JSON: {exc}") from exc
    except RecursionError:  # a 100,000-deep body was an uncaught error: a 502 with a traceback
        raise BadRequestError("malformed JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequestError("the body must be a JSON object")
    take = body.get("take")
    if not isinstance(take, str) or not take.isalnum():
        raise BadRequestError('"take" (the take id the request came with) is required')
    return body


def _json_answer(payload: dict[str, Any]) -> Response[str]:
    """A 200 JSON answer (what Powertools makes of a returned dict, as a Response: a route's return
    annotation is read for the OpenAPI document, and a dict-or-Response union cannot be)."""
    return Response(status_code=200, content_type="application/json",
                    body=json.dumps(payload, separators=(",", ":")))


class TooManyPollsError(ServiceError):
    """429: the endpoint has as many long polls waiting as it may."""

    def __init__(self, endpoint: str, limit: int) -> None:
        super().__init__(429, f"endpoint {endpoint!r} already has {limit} long polls waiting "
                              f"({PENDING['max_polls_per_endpoint'].name}); poll again later")


class PollSlots:
    """At most ``settings.max_polls_per_endpoint`` long polls of one endpoint wait at once, counted
    in Redis so every node (every Lambda environment on AWS) shares the bound: a sorted set per
    endpoint (``<prefix>:{<endpoint>}:polls``, slot -> when it lapses), with a TTL like every key."""

    def __init__(self, queue: PendingQueue) -> None:
        self._store = queue.redis_store
        settings = queue.settings
        self.limit = settings.max_polls_per_endpoint
        self._key_ttl_ms = int((settings.http_poll_wait_s + POLL_SLOT_GRACE_S) * 1000)

    def take(self, endpoint: str, wait_s: float) -> str:
        """A slot for a poll of ``wait_s`` seconds, or TooManyPollsError (the slot is not kept)."""
        slot = secrets.token_hex(8)
        lapses_at = time.time() + wait_s + POLL_SLOT_GRACE_S
        if not self._store.take_poll_slot(endpoint, slot, lapses_at, self._key_ttl_ms, self.limit):
            raise TooManyPollsError(endpoint, self.limit)
        return slot

    def give_back(self, endpoint: str, slot: str) -> None:
        self._store.give_back_poll_slot(endpoint, slot)


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

    def resolve(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
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
    slots = PollSlots(queue)
    retry_after = str(max(1, math.ceil(settings.http_poll_wait_s / 5)))

    def authorize(endpoint: str, request_id: str | None = None) -> None:
        """The endpoint's token, else 401, the same for an endpoint that does not exist."""
        headers = app.current_event.headers
        header = headers.get("Authorization") or headers.get("authorization")
        scheme, _, token = (header or "").partition(" ")
        valid = scheme.lower() == "bearer" and tokens.check(endpoint, token.strip())
        if not (valid and ENDPOINT_NAME.match(endpoint)):
            raise UnauthorizedError(f"missing or wrong token for endpoint {endpoint!r}")
        if request_id is not None and not (len(request_id) == ID_LENGTH and request_id.isalnum()):
            raise NotFoundError(f"no request {request_id!r}")

    @app.get("/health", summary="liveness, without a token", responses=doc.responses(doc.HEALTH))
    def health() -> dict[str, Any]:
        return {"ok": True, "node": queue.node_id}

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> Response[str]:
        return Response(status_code=200, content_type="application/json",
                        body=json.dumps(json.loads(doc.openapi_document(app))))

    @app.get("/endpoints/<endpoint>/next", summary="the next request, or 204 after up to wait seconds",
             responses=doc.responses(doc.NEXT))
    def next_request(endpoint: str, wait: Annotated[float | None, Query(
            description=f"seconds to wait at most (capped by {PENDING['http_poll_wait_s'].name})")] = None,
                     ) -> Response[str]:
        authorize(endpoint)
        raw_wait = app.current_event.get_query_string_value("wait", str(settings.http_poll_wait_s))
        try:
            wait = min(float(raw_wait), settings.http_poll_wait_s)
        except ValueError as exc:
            raise BadRequestError(f"wait must be a number of seconds, got {raw_wait!r}") from exc
        context = app.lambda_context
        if context is not None:
            wait = min(wait, (context.get_remaining_time_in_millis() - LAMBDA_MARGIN_MS) / 1000)
        wait = max(0.0, wait)
        try:
            slot = slots.take(endpoint, wait)
        except TooManyPollsError as exc:
            return Response(status_code=429, content_type="application/json",
                            headers={"Retry-After": retry_after},
                            body=json.dumps({"statusCode": 429, "message": exc.msg}))
        try:
            with app.waiting():
                request = queue.dequeue(endpoint, wait, track=False)
        finally:
            slots.give_back(endpoint, slot)
        if request is None:
            return Response(status_code=204, body="")
        return _json_answer(request.to_json())

    @app.post("/endpoints/<endpoint>/requests/<request_id>/heartbeat",
              summary="the service is alive; the answer says whether to stop",
              responses=doc.responses(doc.HEARTBEAT))
    def heartbeat(endpoint: str, request_id: str,
                  documented: Annotated[doc.HeartbeatIn, Body()] = _READ_BY_ROUTE) -> dict[str, Any]:
        authorize(endpoint, request_id)
        body = _json_body(app, ENVELOPE_BYTES)
        beat = queue.processor_heartbeat(endpoint, request_id, body["take"])
        reason = NOT_HELD if beat.reason in _NOT_HELD_REASONS else beat.reason
        return {"cancelled": beat.cancelled, "reason": reason}

    @app.post("/endpoints/<endpoint>/requests/<request_id>/response", summary="the answer",
              responses=doc.responses(doc.RESPONSE))
    def response(endpoint: str, request_id: str,
                 documented: Annotated[doc.ResponseIn, Body()] = _READ_BY_ROUTE) -> Response[str]:
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
        if delivery in (Delivery.NOT_TAKER, Delivery.GONE):  # gone: expired, or another endpoint's id
            return Response(status_code=409, content_type="application/json",
                            body=json.dumps({"statusCode": 409, "delivery": Delivery.NOT_TAKER.value,
                                             "message": NOT_HELD}))
        return _json_answer({"delivery": delivery.value})

    @app.exception_handler(PendingError)  # StoreUnavailableError, or Redis refusing (WRONGTYPE, OOM)
    def unavailable(exc: PendingError) -> Response:
        return Response(status_code=503, content_type="application/json",
                        body=json.dumps({"statusCode": 503, "message": str(exc)}))

    @app.exception_handler(ValueError)
    def bad_value(exc: ValueError) -> Response:
        return Response(status_code=400, content_type="application/json",
                        body=json.dumps({"statusCode": 400, "message": str(exc)}))

    return app

