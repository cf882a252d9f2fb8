"""The status console: one page and its figures, served by the local HTTP gateway.

``GET /`` is ``console.html`` and ``GET /console.js`` its script (shipped with the package: plain HTML,
CSS and JavaScript, no CDN, so it works on a machine without internet); the page fetches
``GET /status.json`` every ``interval_s`` and draws the figures and two small SVG charts (the delay
scheduler's lateness, each pool's latency). It puts every value into the page as text
(``textContent``, ``setAttribute``), never as markup: keys and endpoint names come from users.

The figures are read by one sampler thread every ``interval_s``, not per request: any number of open
pages cost one read of the services per interval.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any

from switchyard.core.observability import logger
from switchyard.local.http_gateway import HttpGateway

FILES = {"/": ("console.html", "text/html; charset=utf-8"),
         "/console.js": ("console.js", "text/javascript; charset=utf-8")}
SECURITY_HEADERS = {
    # The page loads nothing from elsewhere and runs only its own script file (no inline script).
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; "
                               "connect-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def asset(name: str) -> str:
    """One of the page's files, from the package."""
    return resources.files("switchyard.local").joinpath(name).read_text(encoding="utf-8")


class Console:
    """Serve the page and the figures ``read()`` returns (a JSON-ready dict); ``with`` or start/stop."""

    def __init__(self, read: Callable[[], dict[str, Any]], *, host: str = "127.0.0.1", port: int = 0,
                 interval_s: float = 2.0) -> None:
        self._read = read
        self.interval_s = interval_s
        self._files = {path: (asset(name), kind) for path, (name, kind) in FILES.items()}
        self._latest = json.dumps({"at": None})
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="console-sampler", daemon=True)
        self._gateway = HttpGateway(self.handle, host=host, port=port, threads=8, function_name="console")

    @property
    def url(self) -> str:
        return self._gateway.url

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self._latest = json.dumps({**self._read(), "interval_s": self.interval_s})
            except Exception:  # the page keeps the last figures; the next read tries again
                logger.exception("reading the status failed")
            self._ready.set()
            self._stop.wait(self.interval_s)

    def handle(self, event: dict[str, Any], _context: Any) -> dict[str, Any]:
        """The gateway's handler: the page, its figures, or 404."""
        path, method = event.get("path") or "/", event.get("httpMethod")
        if method not in ("GET", "HEAD"):
            return self._response(405, "text/plain", "only GET")
        if path in self._files:
            body, kind = self._files[path]
            return self._response(200, kind, body)
        if path == "/status.json":
            return self._response(200, "application/json", self._latest)
        return self._response(404, "text/plain", "not found")

    @staticmethod
    def _response(status: int, content_type: str, body: str) -> dict[str, Any]:
        return {"statusCode": status, "headers": {"Content-Type": content_type, **SECURITY_HEADERS},
                "body": body}

    def start(self) -> Console:
        """Take the first figures (so the page never opens empty), then serve."""
        self._sampler.start()
        self._ready.wait(30)
        self._gateway.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._gateway.stop()
        self._sampler.join(10)

    def __enter__(self) -> Console:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
