"""The event bus's demo: a publisher and two subscribers over real HTTP, one failing, then recovering."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, cast

from switchyard.demo.printer import Printer

if TYPE_CHECKING:
    from switchyard.bus.ports import Subscriber


def _subscriber(out: Printer, name: str, failures_left: dict[str, int],
                started: list[float]) -> ThreadingHTTPServer:
    """A subscriber on 127.0.0.1 that prints each batch it gets and fails while ``failures_left`` says so."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            events = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status = 503 if failures_left.get(name, 0) > 0 else 204
            failures_left[name] = failures_left.get(name, 0) - 1
            urls = ", ".join(e["url"].rsplit("/", 1)[-1] for e in events)
            out.line(f"+{(time.monotonic() - started[0]) * 1000:5.0f} ms  {name:9} got {len(events)} "
                     f"event(s) [orders {urls}] -> {status}")
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def event_bus_part(out: Printer) -> None:
    """The event bus: a publisher, two subscribers (one failing, then recovering) and the
    deliveries, over real HTTP on 127.0.0.1 (API, subscribers) with a delivery worker."""
    import requests

    from switchyard.bus.service import BusService
    from switchyard.bus.settings import BusSettings
    from switchyard.local.http_gateway import HttpGateway

    started = [time.monotonic()]  # reset when the events are published: the subscribers print from it
    failures_left = {"billing": 3}
    settings = BusSettings(name=f"demo_{uuid.uuid4().hex[:6]}", root_key=uuid.uuid4().hex,
                           allow_http_callbacks=True, callback_allow="127.0.0.1",  # the subscribers below
                           max_backoff_ms=2000, acquire_timeout_s=0.2)
    bus = BusService.connect(settings)
    store = bus.store
    servers = {name: _subscriber(out, name, failures_left, started) for name in ("warehouse", "billing")}
    gateway = HttpGateway(bus.app(), threads=8).start()
    worker = bus.worker(threads=2).start()
    out.section("Event bus (Routemaster's API): a publisher, two subscribers; billing fails 3 times")
    try:
        def post(token: str, path: str, body: dict) -> requests.Response:
            return requests.post(gateway.url + path, json=body, auth=(token, "x"), timeout=10)

        tokens = {name: post(settings.root_key, "/api_tokens", {"name": name}).json()["token"]
                  for name in ("shop", "warehouse", "billing")}
        for name, options in (("warehouse", {"timeout": 0}), ("billing", {"max": 5, "timeout": 200})):
            callback = f"http://127.0.0.1:{servers[name].server_port}/events"
            post(tokens[name], "/subscription",
                 {"topics": ["orders"], "callback": callback, "uuid": name, **options})
        out.line(f"API on {gateway.url}; warehouse: every event at once (timeout 0); "
                 "billing: up to 5 per batch, 200 ms timeout")
        started[0] = time.monotonic()
        for n in range(1, 7):
            event = {"type": "create", "url": f"https://shop.example/orders/{n}"}
            post(tokens["shop"], "/topics/orders", event)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(store.queued(t)[0] for t in tokens.values()):
            time.sleep(0.05)
        for name in ("warehouse", "billing"):
            sub = cast("Subscriber", store.subscriber(tokens[name]))  # subscribed above
            out.line(f"{name}: {store.queued(tokens[name])[0]} events left, health points "
                     f"{sub.health_points} (-2 per failure, +1 per success); batches in acceptance order")
    finally:
        worker.close()
        gateway.stop()
        for server in servers.values():
            server.shutdown()
        pattern = store.prefix.replace("{", "\\{").replace("}", "\\}") + "*"
        keys = list(store.redis.scan_iter(match=pattern))
        if keys:
            store.redis.delete(*keys)
