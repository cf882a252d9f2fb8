"""What the bus API accepts: Routemaster's request bodies as Pydantic models (validated by the
resolver, documented in its OpenAPI), and the URL rules events and callbacks follow."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, create_model, field_validator

from switchyard.bus.callbacks import check_subscription
from switchyard.bus.settings import BusSettings

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


def check_url(url: str) -> str:
    """Routemaster's rule for an event's URL: https, a host, no query string."""
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


def check_callback(url: str, settings: BusSettings) -> str:
    """A subscription's callback: the rules the worker applies again when it connects
    (``switchyard.bus.callbacks``, the same parser): no internal address unless allowed, http only
    to loopback with SWITCHYARD_BUS_ALLOW_HTTP_CALLBACKS=1."""
    check_subscription(url, allow_http=settings.allow_http_callbacks, allowlist=settings.allowlist)
    return url


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
        return check_url(value)


class SubscriptionBody(_Strict):  # the callback's rules depend on the bus: ``subscription_model``
    """The caller's subscription, whole: topics not listed are unsubscribed."""

    topics: list[TopicName] = Field(max_length=MAX_TOPICS)
    callback: HttpsUrl
    uuid: Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=UUID_PATTERN)] = Field(
        description="the Basic-auth username the bus delivers with (no ':')")
    max: StrictInt | None = Field(None, ge=1, le=MAX_BATCH, description="events per batch, default 100")
    timeout: StrictInt | None = Field(None, ge=0, le=MAX_TIMEOUT_MS,
                                      description="ms a batch may wait, default 500")


def subscription_model(settings: BusSettings) -> type[SubscriptionBody]:
    """``SubscriptionIn`` of one bus: ``SubscriptionBody`` whose callback is checked against its
    settings while the request is validated (so a refused callback is a 400 like any bad field)."""

    def callback(cls: type, value: str) -> str:  # "cls": pydantic calls it as a classmethod
        return check_callback(value, settings)

    return create_model("SubscriptionIn", __base__=SubscriptionBody, __doc__=SubscriptionBody.__doc__,
                        __validators__={"_callback": field_validator("callback")(callback)})
