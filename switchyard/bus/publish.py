"""Publishing, the hot path: ``accept`` queues one validated event (both ways in), and
``fast_publish`` answers an accepted ``POST /topics/<name>`` without the resolver's routing,
middleware and turn (about half the CPU of a publish). A publish's token is checked inside the
ingest script (no lookup of its own, so nothing to cache: a revoked token stops publishing at once).
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from switchyard.bus.auth import Credentials, header_username
from switchyard.bus.errors import BadInputError, StoreError, TopicClaimedError, UnknownTokenError
from switchyard.bus.metrics import BUS_EVENTS_PUBLISHED
from switchyard.bus.models import TOPIC_PATTERN, EventIn
from switchyard.bus.ports import BusStorePort
from switchyard.bus.store import event_json
from switchyard.core import tracing
from switchyard.core.observability import metrics

# Fast publishes run side by side, and Powertools' metric set is one per process: so is its lock.
_metrics_lock = threading.Lock()
_TOPIC_RE = re.compile(TOPIC_PATTERN.removeprefix("^").removesuffix("$"))  # fullmatch: no "\n" before $
_TOPICS = "/topics/"


def proxy_text(status: int, body: str = "") -> dict[str, Any]:
    """A text/plain Lambda proxy response for the answers given without the resolver, shaped as
    the resolver's own (the fast-path test compares them)."""
    return {"statusCode": status, "body": body, "isBase64Encoded": False,
            "multiValueHeaders": {"Content-Type": ["text/plain"]}}


def header_traceparent(headers: dict[str, str] | None) -> str | None:
    """The ``traceparent`` header of a proxy event's headers (either spelling), if any."""
    headers = headers or {}
    return headers.get(tracing.TRACEPARENT_HEADER) or headers.get("Traceparent")


class Publisher:
    """Publishing to one bus."""

    def __init__(self, store: BusStorePort, credentials: Credentials) -> None:
        self.store, self.credentials = store, credentials

    def accept(self, topic: str, token: str, body: EventIn, traceparent: str | None = None) -> None:
        """Queue one validated event: its data size, then the ingest script, which checks the token
        and the topic's owner (UnknownTokenError, TopicClaimedError: nothing was written). With the
        publish's ``traceparent`` header, the event carries the bus's span of that trace to its
        subscribers (a malformed one: a new trace)."""
        if body.data is not None:
            size = len(json.dumps(body.data, separators=(",", ":"), ensure_ascii=False).encode())
            if size > self.store.settings.max_event_data:
                raise BadInputError("bad event")
        timestamp = body.timestamp if body.timestamp is not None else int(time.time() * 1000)
        trace = tracing.continue_from(traceparent) if traceparent is not None else None
        self.store.publish(topic, token, event_json(topic, body.type, body.url, timestamp, body.data,
                                                    trace.traceparent if trace is not None else None))
        tracing.hop(trace, "bus", "published", topic=topic)
        if not is_metrics_disabled():  # Powertools prints every 100 values, disabled or not
            with _metrics_lock:
                metrics.add_metric(name=BUS_EVENTS_PUBLISHED, unit=MetricUnit.Count, value=1)

    def fast_publish(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """An accepted ``POST /topics/<name>``, by the resolver's rules (topic pattern, Basic token
        not root, a JSON object valid as ``EventIn``, ``accept``) and with its answer (a test
        compares them). None for anything else, including every refusal and a Redis error: nothing
        was stored, and the resolver then answers as before (401, 400, 403, 503)."""
        if event.get("httpMethod") != "POST" or event.get("isBase64Encoded"):
            return None
        path = event.get("path") or ""
        if not path.startswith(_TOPICS) or not _TOPIC_RE.fullmatch(topic := path[len(_TOPICS):]):
            return None
        token = header_username(event.get("headers"))
        if token is None or self.credentials.is_root(token):
            return None
        try:
            raw = json.loads(event.get("body") or "")
            if not isinstance(raw, dict):
                return None
            self.accept(topic, token, EventIn.model_validate(raw), header_traceparent(event.get("headers")))
        except (ValueError, RecursionError, BadInputError, UnknownTokenError, TopicClaimedError,
                StoreError):
            return None  # ValueError: bad JSON or a ValidationError; RecursionError: JSON nested too deeply
        return proxy_text(200)
