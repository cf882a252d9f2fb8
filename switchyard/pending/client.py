"""The Python polling-service client: long-polls its node's HTTP API and runs a handler per request.

A polling service connects to exactly one node (``switchyard pending serve`` locally, API Gateway on
AWS). Each of ``concurrency`` loops long-polls ``next``, runs the handler, and posts the response;
while a handler runs, one heartbeat thread tells the node the service is alive (after the initial
delay: quick requests send none) and cancels the request's ``CancelToken`` when the caller
cancelled or is gone. Connection failures and 5xx answers are retried with a capped backoff; a 401
or 404 (wrong token, unknown endpoint) stops the service with a clear error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests

from switchyard.core.errors import ConfigError
from switchyard.pending.model import CancelToken, handler_message
from switchyard.pending.settings import PendingSettings, check_endpoint
from switchyard.pending.streams import StreamRef, StreamStore

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 10.0
RESPONSE_RETRY_S = 30.0


@dataclass
class ServiceRequest:
    """One request as a handler sees it; ``cancel`` fires when the work should stop."""

    id: str
    take: str
    body: Any
    streams: list[StreamRef]
    cancel: CancelToken = field(default_factory=CancelToken)
    traceparent: str | None = None  # the caller's W3C trace context (the handler runs under it)


Handler = Callable[[ServiceRequest], Any]


class PollingService:
    """Serve ``endpoint`` from the node at ``url`` with ``handler``; ``start()``/``stop()``."""

    def __init__(
        self,
        url: str,
        endpoint: str,
        token: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        store: StreamStore | None = None,
        settings: PendingSettings | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.endpoint = check_endpoint(endpoint)
        self.handler, self.store = handler, store
        self.concurrency = concurrency
        self.settings = settings or PendingSettings()
        self._auth = {"Authorization": f"Bearer {token}"}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._active: dict[str, tuple[ServiceRequest, float]] = {}
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()
        self.error: Exception | None = None
        self.handled = 0

    def _path(self, *parts: str) -> str:
        return "/".join((self.url, "endpoints", self.endpoint, *parts))

    def start(self) -> PollingService:
        for i in range(self.concurrency):
            self._spawn(self._poll_loop, f"poll-{self.endpoint}-{i}")
        self._spawn(self._heartbeat_loop, f"beat-{self.endpoint}")
        return self

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling (open long polls are cut); requests in progress are cancelled."""
        self._stop.set()
        with self._lock:
            for request, _ in self._active.values():
                request.cancel.cancel("the polling service is stopping")
            for session in self._sessions:
                session.close()
        for thread in self._threads:
            thread.join(timeout)

    def __enter__(self) -> PollingService:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def run_forever(self) -> None:
        """Block until stopped; raises the error that stopped the service (wrong token...)."""
        self.start()
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self.stop()
        if self.error is not None:
            raise self.error

    # ------------------------------------------------------------ polling

    def _fatal(self, reply: requests.Response) -> None:
        self.error = ConfigError(f"the node refused endpoint {self.endpoint!r}: HTTP {reply.status_code} "
                                 f"{reply.text[:200]}")
        logger.error("%s", self.error)
        self._stop.set()

    def _session(self) -> requests.Session:
        session = requests.Session()
        with self._lock:
            self._sessions.append(session)
        return session

    def _poll_loop(self) -> None:
        session = self._session()
        backoff = 0.0
        wait = self.settings.http_poll_wait_s
        reply: requests.Response | None
        error: requests.RequestException | None
        while not self._stop.is_set():
            try:
                reply = session.get(self._path("next"), params={"wait": wait}, headers=self._auth,
                                    timeout=wait + 10)
            except requests.RequestException as exc:
                if self._stop.is_set():
                    return
                reply, error = None, exc
            else:
                error = None
            if reply is not None and reply.status_code in (401, 403, 404):
                return self._fatal(reply)
            if reply is None or reply.status_code >= 500 or reply.status_code == 429:  # 429: too many polls
                backoff = min(MAX_BACKOFF_S, backoff * 2 or 0.5)
                logger.warning("poll of %s failed (%s); retrying in %.1f s", self.endpoint,
                               error or f"HTTP {reply.status_code}", backoff)  # type: ignore[union-attr]
                self._stop.wait(backoff)
                continue
            backoff = 0.0
            if reply.status_code == 200:
                self._process(session, reply.json())

    def _process(self, session: requests.Session, raw: dict[str, Any]) -> None:
        traceparent = raw.get("traceparent")
        request = ServiceRequest(raw["id"], raw["take"], raw.get("body"),
                                 [StreamRef.from_json(s) for s in raw.get("streams") or []],
                                 traceparent=traceparent if isinstance(traceparent, str) else None)
        first_beat = time.monotonic() + self.settings.heartbeat_initial_delay_s
        with self._lock:
            self._active[request.id] = (request, first_beat)
        try:
            message = handler_message(self.handler, request, self.store)
        finally:
            with self._lock:
                self._active.pop(request.id, None)
        message["take"] = request.take
        self._post_response(session, request, message)
        self.handled += 1

    def _post_response(self, session: requests.Session, request: ServiceRequest,
                       message: dict[str, Any]) -> None:
        deadline = time.monotonic() + RESPONSE_RETRY_S
        url = self._path("requests", request.id, "response")
        while True:
            try:
                reply = session.post(url, json=message, headers=self._auth, timeout=30)
            except requests.RequestException as exc:
                problem = str(exc)
            else:
                problem = f"HTTP {reply.status_code} {reply.text[:200]}"
                if reply.status_code == 413:
                    message = {"take": request.take, "ok": False, "error": "the response was too large"}
                    continue
                if reply.status_code < 500:
                    if reply.status_code != 200:
                        logger.warning("response to %s not accepted: %s", request.id, problem)
                    return
            if time.monotonic() >= deadline or self._stop.is_set():
                logger.error("could not deliver the response to %s: %s", request.id, problem)
                return
            time.sleep(1.0)

    # ---------------------------------------------------------- heartbeats

    def _heartbeat_loop(self) -> None:
        session = self._session()
        interval = self.settings.heartbeat_interval_s
        while not self._stop.wait(min(1.0, interval / 4)):
            now = time.monotonic()
            with self._lock:
                due = [(r, t) for r, t in self._active.values() if t <= now]
                for request, _ in due:
                    self._active[request.id] = (request, now + interval)
            for request, _ in due:
                try:
                    reply = session.post(self._path("requests", request.id, "heartbeat"),
                                         json={"take": request.take}, headers=self._auth, timeout=10)
                    beat = reply.json() if reply.status_code == 200 else {}
                except (requests.RequestException, ValueError) as exc:
                    logger.warning("heartbeat for %s failed: %s", request.id, exc)
                    continue
                if beat.get("cancelled"):
                    request.cancel.cancel(beat.get("reason") or "cancelled")
