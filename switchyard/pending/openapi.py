"""The node API's bodies as pydantic models, and its OpenAPI document (``GET /openapi.json``).

The routes (``switchyard.pending.api``) read their bodies themselves (a size limit first, then JSON
that may nest too deeply: 413 and 400 as they always answered), so the models here document rather
than validate: each route declares its request body as a model with a ``None`` default, which
Powertools puts in the document and never fills in without validation, and its answers through
``responses``. A test calls every route through the local gateway and checks what it answers
against this document.
"""

from __future__ import annotations

import copy
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import BaseModel, ConfigDict, Field

from switchyard import __version__
from switchyard.pending.settings import PENDING


class StreamRef(BaseModel):
    """A stream's reference: the data itself is read from the stream store."""

    model_config = ConfigDict(extra="forbid")
    id: str
    name: str
    size: int = Field(description="bytes")
    sha256: str = Field(description="hex digest of the data")
    location: str = Field(description="where the store keeps it (s3://... or a local path)")


class NextRequest(BaseModel):
    """``GET next``: the request a polling service is to handle."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(description="the request id (32 alphanumeric characters)")
    take: str = Field(description="this take's id: send it with every heartbeat and the response")
    body: Any = Field(description="the caller's JSON body")
    streams: list[StreamRef] = Field(description="the caller's streams")
    enqueued_at_ms: int = Field(description="when the caller queued it (Unix epoch, milliseconds)")
    traceparent: str | None = Field(None, description="the caller's W3C trace context (null: none); "
                                                      "send it on with what the request causes")


class HeartbeatIn(BaseModel):
    """``POST heartbeat``: the service still works on the request."""

    take: str = Field(description="the take id the request came with")


class HeartbeatOut(BaseModel):
    """Whether to stop: the caller cancelled or stopped waiting, or this take no longer holds it."""

    model_config = ConfigDict(extra="forbid")
    cancelled: bool
    reason: str | None = Field(description="why to stop (null while not cancelled)")


class ResponseIn(BaseModel):
    """``POST response``: ``ok`` true with ``body`` (and ``streams``), or false with ``error``."""

    take: str = Field(description="the take id the request came with")
    ok: bool = Field(description="true: body (and streams) is the answer; false: error says why")
    body: Any = Field(None, description="the answer (any JSON), when ok")
    streams: list[StreamRef] = Field(default_factory=list, description="streams written, when ok")
    error: str | None = Field(None, description='what failed, when not ok (default "the service failed")')


class ResponseOut(BaseModel):
    """What became of the response."""

    model_config = ConfigDict(extra="forbid")
    delivery: str = Field(description="delivered; cancelled or abandoned (the caller is gone: dropped)")


class ErrorOut(BaseModel):
    """Every refusal (4xx, 5xx)."""

    model_config = ConfigDict(extra="forbid")
    statusCode: int
    message: str


class NotHeldOut(ErrorOut):
    """409: the take does not hold the request (stale, or not this endpoint's request)."""

    delivery: str = Field(description="not_taker")


class Health(BaseModel):
    """``GET /health``."""

    model_config = ConfigDict(extra="forbid")
    ok: bool
    node: str = Field(description="the node's id")


def _json(description: str, model: type[BaseModel]) -> OpenAPIResponse:
    return {"description": description, "content": {"application/json": {"model": model}}}


_AUTH: dict[int, OpenAPIResponse] = {
    401: _json("missing or wrong token (an unknown endpoint answers the same)", ErrorOut),
    503: _json("Redis unreachable or refusing", ErrorOut)}
_BODY: dict[int, OpenAPIResponse] = {
    **_AUTH, 400: _json("malformed JSON or fields", ErrorOut),
    404: _json("not a request id (32 alphanumeric characters)", ErrorOut),
    409: _json("this take does not hold the request", NotHeldOut)}

HEALTH: dict[int, OpenAPIResponse] = {200: _json("the node answers", Health)}
NEXT: dict[int, OpenAPIResponse] = {
    **_AUTH, 200: _json("the next request", NextRequest),
    204: {"description": "none within the wait (no body)", "content": {}},
    400: _json("wait is not a number", ErrorOut),
    429: _json("as many long polls of the endpoint waiting as "
               f"{PENDING['max_polls_per_endpoint'].name} allows (Retry-After)", ErrorOut)}
HEARTBEAT: dict[int, OpenAPIResponse] = {**_BODY, 200: _json("whether to stop", HeartbeatOut)}
RESPONSE: dict[int, OpenAPIResponse] = {
    **_BODY, 200: _json("what became of the response", ResponseOut),
    413: _json("body over the message limit: send large data as streams", ErrorOut)}


def responses(template: dict[int, OpenAPIResponse]) -> dict[int, OpenAPIResponse]:
    """A route's own copy of a ``responses`` template: Powertools replaces each ``model`` with its
    schema in place when it builds a document, so a shared dict would lose its models (and the
    next resolver's document its components)."""
    return copy.deepcopy(template)


def openapi_document(app: APIGatewayRestResolver) -> str:
    """The OpenAPI 3.1 document of a pending node API resolver (JSON)."""
    from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer

    return app.get_openapi_json_schema(
        title="Switchyard pending node API", version=__version__,
        description="Polling services take requests (long poll), heartbeat while they work, and answer. "
                    "Every /endpoints/{endpoint}/ route needs that endpoint's token: Authorization: Bearer.",
        security_schemes={"bearer": HTTPBearer()}, security=[{"bearer": []}])
