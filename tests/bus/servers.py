"""Real HTTP servers on loopback addresses that misbehave on purpose, for the delivery hardening
tests: one that records every request and answers as told (204, a redirect, ...), one that drips
its answer a byte at a time, one that streams a huge body. Nothing here leaves 127.0.0.0/8 or ::1."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[BaseHTTPRequestHandler], None]


@dataclass
class Seen:
    """One request a server received."""

    at: float
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def no_content(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(204)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def no_content_then_close(handler: BaseHTTPRequestHandler) -> None:
    """A 204 with ``Connection: close``: the next request needs a new connection."""
    handler.send_response(204)
    handler.send_header("Content-Length", "0")
    handler.send_header("Connection", "close")
    handler.end_headers()


def redirect(code: int, location: str) -> Answer:
    """A redirect to ``location`` (which the bus must never follow)."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(code)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def drip(interval_s: float = 0.5, for_s: float = 8.0) -> Answer:
    """A 204 answered one byte every ``interval_s`` for ``for_s`` seconds, then the rest at once:
    no single read ever waits long, so only a total deadline stops it."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        head = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nX-Pad: " + b"." * 64 + b"\r\n\r\n"
        ends = time.monotonic() + for_s
        try:
            i = 0
            while i < len(head) - 1 and time.monotonic() < ends:
                handler.wfile.write(head[i:i + 1])
                handler.wfile.flush()
                i += 1
                time.sleep(interval_s)  # pace: drips the head a byte at a time
            handler.wfile.write(head[i:])
            handler.wfile.flush()
        except OSError:
            pass  # the bus gave up: what it should do
        handler.close_connection = True

    return answer


def huge(total: int, chunk: int = 1 << 16) -> Answer:
    """A 200 with a ``total``-byte body streamed as fast as the client takes it."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(total))
        handler.end_headers()
        block = b"x" * chunk
        try:
            for _ in range(total // chunk):
                handler.wfile.write(block)
        except OSError:
            pass  # the bus stopped reading: what it should do
        handler.close_connection = True

    return answer


class TestServer:
    """An HTTP server on ``host`` (any 127.0.0.0/8 address, or ::1) recording every request.

    ``answer`` decides the response; ``in_flight`` / ``max_in_flight`` count requests being answered;
    with ``tls`` it serves HTTPS."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, host: str = "127.0.0.1", answer: Answer = no_content,
                 tls: ssl.SSLContext | None = None) -> None:
        self.host, self.answer = host, answer
        self.seen: list[Seen] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer._lock:
                    seen = Seen(time.monotonic(), self.command, self.path, dict(self.headers), body)
                    outer.seen.append(seen)
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    outer.answer(self)
                finally:
                    with outer._lock:
                        outer.in_flight -= 1

            do_GET = do_POST = do_PUT = do_HEAD = _any

            def log_message(self, *_args: Any) -> None:
                pass

        family = socket.AF_INET6 if ":" in host else socket.AF_INET

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True

        self.server = Server((host, 0), Handler)
        self.port = self.server.server_port
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str = "/cb", scheme: str = "http") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
