"""The status console: one page and its figures, served by the local HTTP gateway.

``GET /`` is ``console.html`` and ``GET /console.js`` its script (shipped with the package: plain HTML,
CSS and JavaScript, no CDN, so it works on a machine without internet); the page fetches
``GET /status.json`` every ``interval_s`` and draws the figures and two small SVG charts (the delay
scheduler's lateness, each pool's latency). It puts every value into the page as text
(``textContent``, ``setAttribute``), never as markup: keys and endpoint names come from users.

The figures are read by one sampler thread every ``interval_s``, not per request: any number of open
pages cost one read of the services per interval.

It answers only requests addressed to its own names (``Host``): a page of another site whose name
was made to resolve to this machine (DNS rebinding) is same-origin with itself, not with the console,
and would otherwise read ``/status.json``. Its names are the loopback ones, the one it is bound to
and, bound to every interface, the machine's own; any IP address is accepted too (rebinding needs a
name). Other sites may not frame it either (``frame-ancestors``, ``X-Frame-Options``).
"""

from __future__ import annotations

import ipaddress
import json
import socket
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
                               "connect-src 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",  # the same for browsers that predate frame-ancestors
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
EVERY_INTERFACE = frozenset({"", "0.0.0.0", "::"})


def host_names(bound: str) -> frozenset[str]:
    """The names a browser may reach the console by, bound to ``bound``."""
    names = {bound.lower().strip("[]")}
    if bound in EVERY_INTERFACE:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return LOOPBACK_NAMES | names


def host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8070`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    name, _, port = header.rpartition(":")
    return name.rstrip(".") if name and port.isdigit() else header.rstrip(".")


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def asset(name: str) -> str:
    """One of the page's files, from the package."""
    return resources.files("switchyard.local").joinpath(name).read_text(encoding="utf-8")


class Console:
    """Serve the page and the figures ``read()`` returns (a JSON-ready dict); ``with`` or start/stop."""

    def __init__(self, read: Callable[[], dict[str, Any]], *, host: str = "127.0.0.1", port: int = 0,
                 interval_s: float = 2.0) -> None:
        self._read = read
        self._names = host_names(host)
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
        """The gateway's handler: the page, its figures, or 404; 421 for a name that is not its own."""
        path, method = event.get("path") or "/", event.get("httpMethod")
        hosts = [value for name, values in (event.get("multiValueHeaders") or {}).items()
                 if name.lower() == "host" for value in values]
        if len(hosts) > 1 or not all(is_address(host_name(h)) or host_name(h) in self._names for h in hosts):
            return self._response(421, "text/plain", f"this console answers to {self.url}/ only, not to the "
                                  "name this request was sent to (start it with --host NAME to use a name)")
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
