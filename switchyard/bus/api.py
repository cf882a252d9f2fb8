"""The event bus's HTTP API: Routemaster's, as one Powertools REST resolver with request validation
and an OpenAPI document (``GET /openapi.json``).

Served on AWS by API Gateway (REST) + Lambda (``functions/bus_api.py``) and locally by
``switchyard bus serve`` through ``switchyard.local.http_gateway``, both calling ``handle``.
The hot path, an accepted publish, is answered by ``fast_publish`` with the same model and rules
but without the resolver's routing and middleware (half a publish's CPU); every other request,
and every refused publish, goes through the resolver. A publish's token is checked inside the
ingest script (no lookup of its own, so nothing to cache: a revoked token stops publishing at once).
Status codes are Routemaster's; where Routemaster is wrong the difference is on purpose:

- ``DELETE /api_tokens/:token`` revokes the token and removes its subscriber, as Routemaster did
  (root has no subscriber of its own: ``DELETE /subscriber`` is a client's);
- ``DELETE /topics/:name``: only the topic's publisher (or root; an unclaimed topic the client whose
  subscription created it, or root);
- a client's subscriptions create at most ``SWITCHYARD_BUS_MAX_UNCLAIMED_TOPICS`` unclaimed topics
  (403 past it); housekeeping removes old unclaimed topics nobody subscribes to;
- ``GET /subscriptions`` and ``GET /topics`` show a subscriber's ``uuid`` (the credential the bus
  delivers with) only to that subscriber, and other clients' tokens only as their client names;
- an event with a field besides ``type``, ``url``, ``timestamp``, ``data`` is refused (400);
- requests are authenticated before they are validated: without a valid token the answer is 401,
  and a body is read as JSON only after its credential is checked (but an accepted publish's,
  whose token the ingest script checks, in the same round trip); JSON nested deeper than Python's
  recursion limit is a 400, never a crash.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import json
import re
import threading
import time
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import redis
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Path
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, field_validator

from switchyard import __version__
from switchyard.bus.callbacks import check_subscription
from switchyard.bus.settings import BusSettings
from switchyard.bus.store import BusStore, TopicClaimedError, TopicLimitError, UnknownTokenError, event_json
from switchyard.core.observability import logger, metrics, redact

TOPIC_PATTERN = r"^[a-z_]{1,64}$"
UUID_PATTERN = r"^[\x21-\x39\x3b-\x7e]+$"  # printable ASCII but ':' (a Basic-auth username)
NAME_PATTERN = r"^[a-z0-9:_-]{1,64}$"
MAX_URL_LENGTH = 1024
MAX_TIMEOUT_MS = 3_600_000
MAX_BATCH = 10_000  # routemaster-client's own bound on ``max``
MAX_TOPICS = 1_000

TopicName = Annotated[str, StringConstraints(pattern=TOPIC_PATTERN)]
ClientName = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
HttpsUrl = Annotated[str, StringConstraints(min_length=1, max_length=MAX_URL_LENGTH)]

_PRINTABLE_ASCII = re.compile(r"[\x21-\x7e]*")
_store: BusStore | None = None


def configure(store: BusStore | None) -> None:
    """Use ``store`` (tests, ``switchyard bus serve``); None goes back to the environment's."""
    global _store
    _store = store


def store() -> BusStore:
    """The bus this API serves: from ``SWITCHYARD_BUS_*`` and ``SWITCHYARD_REDIS_URL`` unless configured."""
    global _store
    if _store is None:
        from switchyard.core.redis_client import connect_redis

        _store = BusStore(connect_redis(), BusSettings.from_env())
    return _store


def check_url(url: str, *, callback: bool) -> str:
    """Routemaster's rule: an https URL with a host and no query string. ``callback``: also the
    rules the worker applies again when it connects (``switchyard.bus.callbacks``, the same parser):
    no internal address unless allowed, http only to loopback with SWITCHYARD_BUS_ALLOW_HTTP_CALLBACKS=1."""
    if callback:
        settings = store().settings
        check_subscription(url, allow_http=settings.allow_http_callbacks, allowlist=settings.allowlist)
        return url
    if not _PRINTABLE_ASCII.fullmatch(url):
        raise ValueError("URL has spaces or characters outside printable ASCII")
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port
    except ValueError as exc:
        raise ValueError(f"URL is malformed: {exc}") from None
    if not host:
        raise ValueError("URL has no host")
    if "?" in url:
        raise ValueError("URL has query string")
    if parts.scheme == "https":
        return url
    raise ValueError("URL is not HTTPS")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenIn(_Strict):
    """A client to register; without ``token`` one is made: ``<name>--<32 hex>``."""

    name: ClientName
    token: ClientName | None = None


class EventIn(_Strict):
    """One event (Routemaster's, no other field)."""

    type: Literal["create", "update", "delete", "noop"]
    url: HttpsUrl
    timestamp: StrictInt | None = Field(None, ge=0, le=2**53, description="ms since the epoch; default now")
    data: dict[str, Any] | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_url(value, callback=False)


class SubscriptionIn(_Strict):
    """The caller's subscription, whole: topics not listed are unsubscribed."""

    topics: list[TopicName] = Field(max_length=MAX_TOPICS)
    callback: HttpsUrl
    uuid: Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=UUID_PATTERN)] = Field(
        description="the Basic-auth username the bus delivers with (no ':')")
    max: StrictInt | None = Field(None, ge=1, le=MAX_BATCH, description="events per batch, default 100")
    timeout: StrictInt | None = Field(None, ge=0, le=MAX_TIMEOUT_MS,
                                      description="ms a batch may wait, default 500")

    @field_validator("callback")
    @classmethod
    def _callback(cls, value: str) -> str:
        return check_url(value, callback=True)


app = APIGatewayRestResolver(enable_validation=True)
# The resolver keeps the request it handles on itself (``current_event``, ``context``), as Lambda
# runs one request at a time per environment; a threaded local server must do the same.
_one_request_at_a_time = threading.Lock()


def _without_content_type(headers: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (headers or {}).items() if k.lower() != "content-type"}


_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def _proxy_text(status: int, body: str = "") -> dict[str, Any]:
    """A text/plain Lambda proxy response for the answers given without the resolver, shaped as
    the resolver's own (the fast-path test compares them)."""
    return {"statusCode": status, "body": body, "isBase64Encoded": False,
            "multiValueHeaders": {"Content-Type": ["text/plain"]}}


def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda proxy entry point: an accepted publish by ``fast_publish``, anything else by
    ``app.resolve`` with every body read as JSON text, whatever its Content-Type (as Routemaster's
    parser does: ``curl -d`` sends form-urlencoded, and Powertools would parse a form, or fail on a
    multipart type without a boundary). A body that is not UTF-8 becomes invalid JSON, refused like
    any other (401 or 400), not a handler crash. A POST (every route with a body) is authenticated
    before its body is parsed, and JSON too deeply nested to parse is a 400."""
    if _CONTROL_CHARS.search(event.get("path") or ""):
        # Powertools' route patterns end in ``$``, which matches before a final newline: without this
        # ``POST /topics/fast%0A`` would publish to topic ``fast``.
        return _proxy_text(400, "bad path: control characters")
    accepted = fast_publish(event)
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
            refused = _refuse_before_parsing(event, body)
            if refused is not None:
                return refused
    with _one_request_at_a_time:
        return app.resolve(event, context)


_TOO_DEEP = "bad data in payload: JSON nested too deeply"


def _refuse_before_parsing(event: dict[str, Any], body: str) -> dict[str, Any] | None:
    """401 for a body without a valid credential (it is never parsed), 400 for JSON nested too
    deeply to parse (an uncaught RecursionError was a 502 with a traceback), else None."""
    headers = event.get("headers") or {}
    try:
        who = _who(basic_username(headers.get("Authorization") or headers.get("authorization")))
    except redis.RedisError as exc:  # as the resolver's handler answers it
        return _proxy_text(503, _storage_unavailable(exc))
    if who is None:
        return {**_proxy_text(401, f"this endpoint requires authentication with {ANYONE}"),
                "multiValueHeaders": {"Content-Type": ["text/plain"], "WWW-Authenticate": ["Basic"]}}
    try:
        json.loads(body)
    except RecursionError:
        return _proxy_text(400, _TOO_DEEP)
    except ValueError:
        pass  # the resolver refuses it with its own message
    return None


class Unauthorized(Exception):
    """No valid credential of the kind the endpoint needs."""

    def __init__(self, kinds: tuple[str, ...]) -> None:
        super().__init__(", or ".join(f"a {kind} token" for kind in kinds))


def _basic_username() -> str | None:
    return basic_username(app.current_event.headers.get("authorization"))


@functools.lru_cache(maxsize=1024)
def basic_username(header: str | None) -> str | None:
    """The username of a Basic ``Authorization`` header, else None (cached: a publisher sends the
    same header with every event; the result depends on the header alone)."""
    scheme, _, encoded = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        username, sep, _password = decoded.partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return username if sep and username else None


def _is_root(username: str) -> bool:
    root_key = store().settings.root_key
    return bool(root_key) and hmac.compare_digest(username.encode(), root_key.encode())


def caller() -> tuple[str, str] | None:
    """("root", key) or ("client", token) for the request's Basic credentials, else None."""
    return _who(_basic_username())


def _who(username: str | None) -> tuple[str, str] | None:
    if username is None:
        return None
    if _is_root(username):
        return "root", username
    if store().token_exists(username):
        return "client", username
    return None


def require(*kinds: str) -> tuple[str, str]:
    who = caller()
    if who is None or who[0] not in kinds:
        raise Unauthorized(kinds)
    return who


class BadInput(Exception):
    """A 400 with this message."""


def object_body(message: str) -> None:
    """The JSON body must be one object: Powertools' validation takes ``[x]`` for ``x``."""
    if not isinstance(app.current_event.json_body, dict):
        raise BadInput(message)


def _text(status: int, message: str = "") -> Response[str]:
    return Response(status_code=status, content_type="text/plain", body=message)


def _json(status: int, payload: Any) -> Response[str]:
    return Response(status_code=status, content_type="application/json", body=json.dumps(payload))


ANYONE = Unauthorized(("root", "client"))


@app.exception_handler(Unauthorized)
def _unauthorized(exc: Unauthorized) -> Response[str]:
    return Response(status_code=401, content_type="text/plain", headers={"WWW-Authenticate": "Basic"},
                    body=f"this endpoint requires authentication with {exc}")


@app.exception_handler(BadInput)
def _bad_input(exc: BadInput) -> Response[str]:
    if caller() is None:  # authentication first, whatever is wrong with the input
        return _unauthorized(ANYONE)
    return _text(400, str(exc))


@app.exception_handler(RequestValidationError)
def _invalid(exc: RequestValidationError) -> Response[str]:
    """Bad input is 400 (Routemaster's code), once the caller has shown a valid credential."""
    if caller() is None:
        return _unauthorized(ANYONE)
    errors = exc.errors()
    event = app.current_event
    if event.http_method == "POST" and event.path.startswith("/topics/"):
        bad_path = any(e.get("loc", ("",))[0] == "path" for e in errors)
        return _text(400, "bad topic" if bad_path else "bad event")
    details = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg', '')}"
                        for e in errors[:5])
    return _text(400, redact(f"bad data in payload: {details}"))


@app.exception_handler(redis.RedisError)
def _redis_down(exc: redis.RedisError) -> Response[str]:
    return _text(503, _storage_unavailable(exc))


def _storage_unavailable(exc: redis.RedisError) -> str:
    """Log a Redis error; the message a 503 says."""
    logger.warning("bus API: Redis error", extra={"error": str(exc)})
    return "storage unavailable"


# -- health ------------------------------------------------------------------------------------


@app.get("/health", summary="liveness, without authentication")
def health() -> Response[str]:
    return _json(200, {})


@app.get("/pulse", summary="204 when Redis answers", responses={204: {"description": "Redis answers"}})
def pulse() -> Response[str]:
    require("root", "client")
    try:
        store().redis.ping()
    except redis.RedisError:
        return _text(500)
    return _text(204)


@app.get("/openapi.json", include_in_schema=False)
def openapi() -> Response[str]:
    return _json(200, json.loads(openapi_document()))


def openapi_document() -> str:
    """The OpenAPI 3.1 document of this API (JSON)."""
    from aws_lambda_powertools.event_handler.openapi.models import HTTPBase

    return app.get_openapi_json_schema(
        title="Switchyard event bus", version=__version__,
        description="Routemaster's API (HTTP Basic: the username is an API token, the password is ignored).",
        security_schemes={"basic": HTTPBase(scheme="basic")}, security=[{"basic": []}])


# -- tokens (root) -----------------------------------------------------------------------------


@app.get("/api_tokens", summary="list client tokens (root)",
         responses={204: {"description": "no tokens yet"}})
def list_tokens() -> Response[str]:
    require("root")
    tokens = store().tokens()
    if not tokens:
        return _text(204)
    return _json(200, [{"name": name, "token": token} for token, name in sorted(tokens.items())])


@app.post("/api_tokens", summary="register a client (root)", responses={201: {"description": "created"}})
def create_token(body: TokenIn) -> Response[str]:
    require("root")
    object_body("bad data in payload: not a JSON object")
    try:
        token = store().create_token(body.name, body.token)
    except ValueError as exc:
        return _text(400, str(exc))
    return _json(201, {"token": token, "name": body.name})


@app.delete("/api_tokens/<token>", summary="revoke a token and remove its subscriber (root)",
            responses={204: {"description": "revoked (or never existed)"}})
def delete_token(token: str) -> Response[str]:
    require("root")
    store().delete_token(token)
    return _text(204)


# -- topics ------------------------------------------------------------------------------------


def _display_token(token: str | None, who: tuple[str, str], names: dict[str, str]) -> str | None:
    """A token as another client may see it: its client name (tokens are credentials)."""
    if token is None or who[0] == "root" or token == who[1]:
        return token
    return names.get(token, "revoked")


@app.get("/topics", summary="every topic, its publisher and events ever published")
def list_topics() -> Response[str]:
    who = require("client", "root")
    names = store().tokens()
    topics = store().topics()
    for t in topics:
        t["publisher"] = _display_token(t["publisher"], who, names)
    return _json(200, topics)


@app.post("/topics/<name>", summary="publish an event; the first publisher claims the topic",
          responses={200: {"description": "accepted"},
                     403: {"description": "topic claimed by another client"}})
def publish(name: Annotated[str, Path(pattern=TOPIC_PATTERN)], body: EventIn) -> Response[str]:
    token = _basic_username()  # the ingest script checks it: one round trip per publish
    if token is None or _is_root(token):
        raise Unauthorized(("client",))
    object_body("bad event")
    try:
        accept(name, token, body)
    except UnknownTokenError:
        raise Unauthorized(("client",)) from None
    except TopicClaimedError:
        return _text(403, "topic claimed")
    return _text(200)


def accept(topic: str, token: str, body: EventIn) -> None:
    """Queue one validated event (both ways in): its data size, then the ingest script, which checks
    the token and the topic's owner (UnknownTokenError, TopicClaimedError: nothing was written)."""
    s = store()
    if body.data is not None:
        size = len(json.dumps(body.data, separators=(",", ":"), ensure_ascii=False).encode())
        if size > s.settings.max_event_data:
            raise BadInput("bad event")
    timestamp = body.timestamp if body.timestamp is not None else int(time.time() * 1000)
    s.publish(topic, token, event_json(topic, body.type, body.url, timestamp, body.data))
    if not is_metrics_disabled():  # Powertools prints every 100 values, disabled or not
        with _metrics_lock:
            metrics.add_metric(name="BusEventsPublished", unit=MetricUnit.Count, value=1)


_metrics_lock = threading.Lock()  # fast publishes run side by side; Powertools' metric set is shared
_TOPIC_RE = re.compile(TOPIC_PATTERN.removeprefix("^").removesuffix("$"))  # fullmatch: no "\n" before $
_TOPICS = "/topics/"


def fast_publish(event: dict[str, Any]) -> dict[str, Any] | None:
    """An accepted ``POST /topics/<name>`` without the resolver's routing, middleware and turn
    (about half the CPU of a publish): the same rules (topic pattern, Basic token not root, a JSON
    object valid as ``EventIn``, ``accept``), and the resolver's own answer (a test compares them).

    None for anything else, including every refusal and a Redis error: nothing was stored, and the
    resolver then answers as before (401, 400, 403, 503) from its one set of handlers."""
    if event.get("httpMethod") != "POST" or event.get("isBase64Encoded"):
        return None
    path = event.get("path") or ""
    if not path.startswith(_TOPICS) or not _TOPIC_RE.fullmatch(topic := path[len(_TOPICS):]):
        return None
    headers = event.get("headers") or {}
    token = basic_username(headers.get("Authorization") or headers.get("authorization"))
    if token is None or _is_root(token):
        return None
    try:
        raw = json.loads(event.get("body") or "")
        if not isinstance(raw, dict):
            return None
        accept(topic, token, EventIn.model_validate(raw))
    except (ValueError, RecursionError, BadInput, UnknownTokenError, TopicClaimedError, redis.RedisError):
        return None  # ValueError: bad JSON or a ValidationError; RecursionError: JSON nested too deeply
    return _proxy_text(200)


@app.delete("/topics/<name>", summary="delete a topic (its publisher, or root; an unclaimed topic also "
            "the client whose subscription created it); subscriptions to it go",
            responses={204: {"description": "deleted"}, 403: {"description": "not the publisher"},
                       404: {"description": "no such topic"}})
def delete_topic(name: str) -> Response[str]:
    kind, token = require("client", "root")
    done = store().delete_topic(name, token if kind == "client" else None)
    if done == 0:
        return _text(404, "topic not found")
    if done < 0:
        return _text(403, "only the topic's publisher may delete it")
    return _text(204)


# -- subscriptions -----------------------------------------------------------------------------


def _subscribe(body: SubscriptionIn) -> Response[str]:
    _, token = require("client")
    object_body("bad data in payload: not a JSON object")
    try:
        store().subscribe(token, body.topics, body.callback, body.uuid, body.max, body.timeout,
                          registered=True)
    except UnknownTokenError:
        raise Unauthorized(("client",)) from None
    except TopicLimitError as exc:
        return _text(403, str(exc))
    return _text(204)


@app.post("/subscription", summary="subscribe (the whole subscription: unlisted topics are left)",
          responses={204: {"description": "subscribed"},
                     403: {"description": "too many unclaimed topics created by this client"}})
def subscribe(body: SubscriptionIn) -> Response[str]:
    return _subscribe(body)


@app.post("/subscriber", summary="alias of POST /subscription",
          responses={204: {"description": "subscribed"},
                     403: {"description": "too many unclaimed topics created by this client"}})
def subscribe_alias(body: SubscriptionIn) -> Response[str]:
    return _subscribe(body)


@app.delete("/subscriber", summary="unsubscribe from everything and drop queued events",
            responses={204: {"description": "deleted"}, 404: {"description": "not subscribed"}})
def delete_subscriber() -> Response[str]:
    _, token = require("client")  # root has none: DELETE /api_tokens/:token removes a client's
    if not store().delete_subscriber(token):
        return _text(404, "subscriber not found")
    return _text(204)


_UNSUBSCRIBE_ERRORS = {-1: "subscriber not found", -2: "topic not found", -3: "not subscribed"}


@app.delete("/subscriber/topics/<name>", summary="unsubscribe from one topic",
            responses={204: {"description": "unsubscribed"}, 404: {"description": "not found"}})
def unsubscribe(name: str) -> Response[str]:
    _, token = require("client")
    done = store().unsubscribe(token, name)
    if done < 0:
        return _text(404, _UNSUBSCRIBE_ERRORS[done])
    return _text(204)


def _subscriptions() -> Response[str]:
    who = require("root", "client")
    s = store()
    names = s.tokens()
    out = []
    for token in s.subscriber_tokens():
        sub = s.subscriber(token, with_topics=True)
        if sub is None:
            continue
        queued, oldest = s.queued(token)
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


def _strip_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


@app.get("/subscriptions", summary="every subscription (uuid only to its own subscriber)")
def subscriptions() -> Response[str]:
    return _subscriptions()


@app.get("/subscribers", summary="alias of GET /subscriptions")
def subscribers() -> Response[str]:
    return _subscriptions()
