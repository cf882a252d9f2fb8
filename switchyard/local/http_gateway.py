"""API Gateway (REST, Lambda proxy integration) on 127.0.0.1: real HTTP in, the Lambda handler's code path.

Each HTTP request becomes the proxy event API Gateway REST would send (method, path, headers and
multiValueHeaders, query string parameters single and multi-valued, body as text or base64,
requestContext) and is handed to the same handler a Lambda behind API Gateway runs (a Powertools
``APIGatewayRestResolver``'s ``resolve`` or a ``lambda_handler``), with a ``FakeLambdaContext``
whose time runs out at the integration timeout. The handler's proxy response (status, headers
and multiValueHeaders, body, isBase64Encoded) becomes the HTTP response. A handler that raises or
returns something that is not a proxy response gets API Gateway's 502.

The server is waitress: a maintained, pure-Python production WSGI server (no C build, runs on any
machine the project does). Its I/O loop holds any number of idle connections; each request in
progress holds one worker thread, so ``threads`` bounds how many long polls can wait at once
(default 512: hundreds of pollers holding a request open for up to 29 s each). ``poll()`` is used
instead of ``select()`` so more than 1,024 sockets work. A request head (request line and
headers) must arrive within ``SWITCHYARD_HTTP_HEAD_TIMEOUT_S`` seconds (default 10) of the
connection opening or of its first byte: slowloris clients dripping an incomplete head are
closed. Heads are read by the I/O loop, never by a worker thread, and at the connection limit a new
client closes the oldest incomplete head (then the longest idle keep-alive connection) instead of
waiting (``http_connections.ShedAtTheLimit``): 1,000 dripping heads had kept new clients out until the head
timeout (9.2 s). Requests in progress are never cut by either.

Known difference from API Gateway: a header sent several times reaches the handler as one value,
joined with ", " (WSGI joins repeated headers, as RFC 9110 5.3 allows for list-valued fields).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import email.utils
import functools
import http
import importlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

import waitress.server
from waitress import wasyncore

from switchyard.core.observability import redact
from switchyard.core.settings import HTTP_HEAD_TIMEOUT
from switchyard.local.http_connections import Channel, ShedAtTheLimit, cut_slow_heads
from switchyard.local.lambda_context import FakeLambdaContext

logger = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]

# API Gateway REST's own limits: a 29 s integration timeout and a 10 MB payload.
INTEGRATION_TIMEOUT_MS = 29_000
MAX_PAYLOAD_BYTES = 10 * 1024 * 1024
DEFAULT_HEAD_TIMEOUT_S = 10.0
LOCAL_ACCOUNT = "000000000000"
# Headers WSGI keeps outside HTTP_* (their names as a client sends them).
_CONTENT_HEADERS = {"CONTENT_TYPE": "Content-Type", "CONTENT_LENGTH": "Content-Length"}
# Hop-by-hop headers the server itself owns.
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"}


def as_handler(target: Any) -> Handler:
    """A resolver (anything with ``resolve(event, context)``) or a Lambda handler, as a handler."""
    resolve = getattr(target, "resolve", None)
    if callable(resolve):
        return resolve
    if callable(target):
        return target
    raise TypeError(f"not a resolver or Lambda handler: {target!r}")


@functools.lru_cache(maxsize=1024)
def _header_name(environ_key: str) -> str:
    """``HTTP_USER_AGENT`` -> ``User-Agent`` (cached: clients send the same few names every time)."""
    return "-".join(part.capitalize() for part in environ_key.removeprefix("HTTP_").split("_"))


def _request_id() -> str:
    """A random version-4 UUID as text, without uuid4's object (a third of the event's cost)."""
    h = f"{random.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


@functools.lru_cache(maxsize=2)
def _request_time(epoch_s: int) -> str:
    """API Gateway's ``requestTime`` for one second (formatted once per second, not per request)."""
    return time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(epoch_s))


def _wsgi_text(value: str) -> str:
    """WSGI hands paths and query strings as latin-1-decoded bytes; API Gateway decodes UTF-8."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


def event_from_environ(environ: dict[str, Any], stage: str = "local") -> dict[str, Any]:
    """The API Gateway REST proxy event for one WSGI request (resource ``/{proxy+}``)."""
    method = environ["REQUEST_METHOD"]
    path = _wsgi_text(environ.get("PATH_INFO") or "/") or "/"
    multi_headers: dict[str, list[str]] = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = _header_name(key)
        elif key in _CONTENT_HEADERS and value:
            name = _CONTENT_HEADERS[key]
        else:
            continue
        multi_headers.setdefault(name, []).append(value)
    multi_query: dict[str, list[str]] = {}
    query = environ.get("QUERY_STRING")
    for name, value in parse_qsl(_wsgi_text(query), keep_blank_values=True) if query else ():
        multi_query.setdefault(name, []).append(value)
    length = int(environ.get("CONTENT_LENGTH") or 0)
    raw = environ["wsgi.input"].read(length) if length > 0 else b""
    body: str | None = None
    is_base64 = False
    if raw:
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError:
            body, is_base64 = base64.b64encode(raw).decode("ascii"), True
    now_ms = time.time_ns() // 1_000_000
    proxy = path.lstrip("/")
    return {
        "resource": "/{proxy+}" if proxy else "/",
        "path": path,
        "httpMethod": method,
        "headers": {name: values[-1] for name, values in multi_headers.items()} or None,
        "multiValueHeaders": multi_headers or None,
        "queryStringParameters": {name: values[-1] for name, values in multi_query.items()} or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": {"proxy": proxy} if proxy else None,
        "stageVariables": None,
        "requestContext": {
            "accountId": LOCAL_ACCOUNT,
            "apiId": "local",
            "resourceId": "local",
            "resourcePath": "/{proxy+}" if proxy else "/",
            "httpMethod": method,
            "path": f"/{stage}{path}",
            "stage": stage,
            "protocol": environ.get("SERVER_PROTOCOL", "HTTP/1.1"),
            "requestId": _request_id(),
            "extendedRequestId": _request_id(),
            "requestTime": _request_time(now_ms // 1000),
            "requestTimeEpoch": now_ms,
            "domainName": environ.get("HTTP_HOST", "127.0.0.1"),
            "identity": {
                "sourceIp": environ.get("REMOTE_ADDR", "127.0.0.1"),
                "userAgent": environ.get("HTTP_USER_AGENT"),
            },
        },
        "body": body,
        "isBase64Encoded": is_base64,
    }


def http_response(result: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body bytes of a Lambda proxy response (ValueError if it is not one)."""
    if not isinstance(result, dict) or not isinstance(result.get("statusCode"), int):
        raise ValueError("the handler did not return a proxy response with an integer statusCode")
    headers: list[tuple[str, str]] = []
    single = result.get("headers") or {}
    multi = result.get("multiValueHeaders") or {}
    for name, values in multi.items():
        headers.extend((name, str(v)) for v in values)
    # API Gateway merges both; a name in both keeps the multi-value list.
    headers.extend((name, str(v)) for name, v in single.items() if name not in multi)
    headers = [(n, v) for n, v in headers if n.lower() not in _HOP_BY_HOP]
    body = result.get("body") or ""
    if result.get("isBase64Encoded"):
        try:
            data = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"isBase64Encoded but the body is not base64: {exc}") from exc
    else:
        data = body.encode("utf-8") if isinstance(body, str) else json.dumps(body).encode("utf-8")
    return result["statusCode"], headers, data


@functools.lru_cache(maxsize=2)
def _http_date(epoch_s: int) -> str:
    """The response's Date header for one second (waitress would format one per response)."""
    return email.utils.formatdate(epoch_s, usegmt=True)


@functools.lru_cache(maxsize=128)
def _status_line(code: int) -> str:
    try:
        return f"{code} {http.HTTPStatus(code).phrase}"
    except ValueError:
        return f"{code} Status {code}"


class HttpGateway:
    """Serve one Lambda proxy handler over HTTP; ``start()``/``stop()`` or a ``with`` block.

    ``port=0`` takes an ephemeral port (read ``port``/``url`` after ``start()``). ``head_timeout_s``:
    how long a request head may take (default ``SWITCHYARD_HTTP_HEAD_TIMEOUT_S``, 10 s).
    ``connection_limit``: open sockets, the listener's two included (default ``max(1000, 2 * threads)``);
    at the limit new clients shed connections that hold no request (``http_connections.ShedAtTheLimit``).
    """

    def __init__(
        self,
        handler: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        threads: int = 512,
        function_name: str = "local-gateway",
        timeout_ms: int = INTEGRATION_TIMEOUT_MS,
        stage: str = "local",
        max_body_bytes: int = MAX_PAYLOAD_BYTES,
        head_timeout_s: float | None = None,
        connection_limit: int | None = None,
    ) -> None:
        self._handler = as_handler(handler)
        if head_timeout_s is None:
            head_timeout_s = HTTP_HEAD_TIMEOUT.read()
        if head_timeout_s <= 0:
            raise ValueError(f"the request head timeout must be positive, got {head_timeout_s}")
        self._head_timeout_s = head_timeout_s
        self._host, self._requested_port = host, port
        self._threads = threads
        self._connection_limit = connection_limit or max(1000, threads * 2)
        self._function_name, self._timeout_ms, self._stage = function_name, timeout_ms, stage
        self._max_body_bytes = max_body_bytes
        self._stopping = threading.Event()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234``."""
        return f"http://{self._host}:{self.port}"

    def wsgi_app(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        """One request: event, handler, response. Never lets an exception reach waitress."""
        started = time.monotonic()
        try:
            event = event_from_environ(environ, self._stage)
        except Exception:  # an unreadable request body: the connection broke mid-request
            logger.exception("could not read the request")
            return self._reply(start_response, 400, {"message": "Bad request"})
        context = FakeLambdaContext(self._function_name, self._timeout_ms, self._stopping)
        try:
            status, headers, body = http_response(self._handler(event, context))
        except Exception:
            logger.exception("handler failed for %s %s", event["httpMethod"], redact(event["path"]))
            return self._reply(start_response, 502, {"message": "Internal server error"})
        logger.debug("%s %s -> %d in %.1f ms", event["httpMethod"], redact(event["path"]), status,
                      (time.monotonic() - started) * 1000)
        headers.append(("Content-Length", str(len(body))))
        if not any(name.lower() == "date" for name, _ in headers):
            headers.append(("Date", _http_date(int(time.time()))))
        start_response(_status_line(status), headers)
        return [body]

    @staticmethod
    def _reply(start_response: Callable, status: int, payload: dict[str, Any]) -> list[bytes]:
        body = json.dumps(payload).encode()
        start_response(_status_line(status), [("Content-Type", "application/json"),
                                               ("Content-Length", str(len(body)))])
        return [body]

    def start(self) -> HttpGateway:
        """Bind and serve on a background thread; returns at once, ready for requests."""
        if self._server is not None:
            raise RuntimeError("gateway already started")
        self._stopping.clear()
        self._server = waitress.server.create_server(
            self.wsgi_app,
            map={},
            host=self._host,
            port=self._requested_port,
            threads=self._threads,
            connection_limit=self._connection_limit,
            channel_timeout=max(120, self._timeout_ms // 1000 + 30),
            cleanup_interval=max(1, min(30, int(self._head_timeout_s / 2))),
            backlog=2048,
            asyncore_use_poll=True,
            max_request_body_size=self._max_body_bytes,
            ident="switchyard-local-gateway",
            clear_untrusted_proxy_headers=True,
        )
        self._server.channel_class = Channel
        self._server.maintenance = cut_slow_heads(self._server, self._head_timeout_s)
        ShedAtTheLimit(self._server)
        self.port = int(self._server.effective_port)
        self._thread = threading.Thread(target=self._server.run, name=f"gateway:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection, wait (up to ``timeout``) for handlers in progress,
        then end the I/O loop. A handler still running after ``timeout`` keeps the loop's wake-up
        pipe open (it is pulled when the handler finishes) and ends with the process."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._server = self._thread = None
        self._stopping.set()
        socket_map = server._map

        def close_connections() -> None:  # on the I/O loop's own thread (waitress's trigger)
            for dispatcher in list(socket_map.values()):
                if dispatcher is server:
                    wasyncore.dispatcher.close(server)  # the listener; BaseWSGIServer.close shuts the trigger
                elif dispatcher is not server.trigger:
                    dispatcher.close()

        if not _pull_trigger(server, close_connections):
            close_connections()  # no wake-up pipe: close from here; the loop's next poll finds none
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=timeout)
        if server.task_dispatcher.threads:
            running = len(server.task_dispatcher.threads)
            logger.warning("gateway stopped, %d handler(s) still running", running)
            return
        _pull_trigger(server, server.trigger.close)  # the map is empty: the loop ends
        thread.join(timeout)

    def __enter__(self) -> HttpGateway:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def _pull_trigger(server: Any, thunk: Any) -> bool:
    """Run ``thunk`` on the I/O loop's thread, unless waitress already closed its wake-up pipe.

    Waitress can close the pipe itself while its loop winds down (Pylons/waitress#468); the write
    then fails with EBADF; returns False so the caller can do the work itself.
    """
    try:
        server.trigger.pull_trigger(thunk)
    except OSError as exc:
        logger.debug("gateway wake-up pipe already closed", extra={"error": str(exc)})
        return False
    return True


def load_target(spec: str) -> Any:
    """``module:attribute`` (a resolver or a Lambda handler), e.g. ``functions.pending_api:app``."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected module:attribute, got {spec!r}")
    return getattr(importlib.import_module(module_name), attribute)


def main(argv: list[str] | None = None) -> int:
    """``python -m switchyard.local.http_gateway module:resolver --port 8080``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="module:attribute of a resolver or Lambda handler")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--threads", type=int, default=512, help="requests in progress at once")
    args = parser.parse_args(argv)
    gateway = HttpGateway(load_target(args.target), host=args.host, port=args.port, threads=args.threads)
    gateway.start()
    print(f"serving {args.target} on {gateway.url}; Ctrl-C to stop", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        gateway.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
