"""Fixtures of the event bus tests: a bus of its own per test (its own Redis hash tag), the API
served over real HTTP, a real HTTP subscriber on 127.0.0.1, and workers."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from switchyard.bus.api import BusApp, build_app
from switchyard.bus.settings import BusSettings
from switchyard.bus.store import BusStore
from switchyard.bus.worker import BusWorker
from switchyard.core.redis_client import connect_redis
from switchyard.local.http_gateway import HttpGateway
from tests.bus.servers import TestServer
from tests.conftest import unique, wait_for

ROOT_KEY = "root-key-for-tests"
# The subscribers of the tests listen on 127.0.0.1: the one internal address their callbacks may
# reach (SWITCHYARD_BUS_CALLBACK_ALLOW); 127.0.0.2 and the rest of 127.0.0.0/8 stay refused.
TEST_CALLBACK_ALLOW = "127.0.0.1"


def fast_settings(name: str, **overrides: Any) -> BusSettings:
    """Test timings: short acquire, heartbeat and housekeeping intervals."""
    base = dict(name=name, root_key=ROOT_KEY, allow_http_callbacks=True, callback_allow=TEST_CALLBACK_ALLOW,
                acquire_timeout_s=0.2,
                heartbeat_ms=200, scrub_after_ms=1000, scrub_interval_ms=300, monitor_interval_ms=500,
                autodrop_interval_ms=500, delivery_timeout_s=5.0)
    base.update(overrides)
    return BusSettings(**base)


def drop_bus(store: BusStore) -> None:
    keys = list(store.redis.scan_iter(match=store.prefix.replace("{", "\\{").replace("}", "\\}") + "*",
                                      count=1000))
    if keys:
        store.redis.delete(*keys)


@pytest.fixture
def make_store() -> Iterator[Callable[..., BusStore]]:
    made: list[BusStore] = []

    def make(**overrides: Any) -> BusStore:
        store = BusStore(connect_redis(), fast_settings(unique("bus"), **overrides))
        made.append(store)
        return store

    yield make
    for store in made:
        drop_bus(store)


@pytest.fixture
def store(make_store) -> BusStore:
    return make_store()


class Client:
    """An HTTP client of the bus API with one Basic-auth token."""

    def __init__(self, base: str, token: str) -> None:
        self.base, self.session = base, requests.Session()
        self.session.auth = (token, "x")
        self.token = token

    def __getattr__(self, method: str) -> Callable[..., requests.Response]:
        return lambda path, **kw: self.session.request(method.upper(), self.base + path, timeout=10, **kw)


@dataclasses.dataclass
class Bus:
    """The API of ``store`` served on ``url``; ``serve`` swaps the store the running gateway serves."""

    store: BusStore
    app: BusApp
    url: str = ""
    root: Client | None = None

    def client(self, name: str) -> Client:
        response = self.root.post("/api_tokens", json={"name": name})
        assert response.status_code == 201, response.text
        return Client(self.url, response.json()["token"])

    def serve(self, store: BusStore) -> None:
        """From the next request on, the gateway serves the API of ``store`` (other settings)."""
        self.app = build_app(store)

    def resolve(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        return self.app.resolve(event, context)


@pytest.fixture
def bus(store) -> Iterator[Bus]:
    served = Bus(store, build_app(store))
    gateway = HttpGateway(served.resolve, threads=16).start()
    served.url, served.root = gateway.url, Client(gateway.url, ROOT_KEY)
    try:
        yield served
    finally:
        gateway.stop()


@dataclasses.dataclass
class Delivery:
    at: float
    status: int
    authorization: str | None
    content_type: str | None
    events: list[dict[str, Any]]


class Subscriber:
    """A real HTTP server on 127.0.0.1 that records every batch POSTed to it.

    ``respond`` decides the status of each request (default 204); ``hold`` makes requests wait
    until it is set."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.respond: Callable[[list[dict[str, Any]]], int] = lambda _events: 204
        self.hold: threading.Event | None = None
        self.arrived = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                events = json.loads(body)
                outer.arrived.set()
                if outer.hold is not None:
                    outer.hold.wait(30)
                status = outer.respond(events)
                outer.deliveries.append(Delivery(time.monotonic(), status, self.headers.get("Authorization"),
                                                 self.headers.get("Content-Type"), events))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/events"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ok_events(self) -> list[dict[str, Any]]:
        return [e for d in self.deliveries if 200 <= d.status < 300 for e in d.events]

    def close(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def subscriber() -> Iterator[Subscriber]:
    sub = Subscriber()
    yield sub
    sub.close()


@pytest.fixture
def make_subscriber() -> Iterator[Callable[[], Subscriber]]:
    made: list[Subscriber] = []

    def make() -> Subscriber:
        made.append(Subscriber())
        return made[-1]

    yield make
    for sub in made:
        sub.close()


@pytest.fixture
def make_server() -> Iterator[Callable[..., TestServer]]:
    """Misbehaving HTTP servers on loopback addresses (``tests/bus/servers.py``), closed after the test."""
    made: list[TestServer] = []

    def make(host: str = "127.0.0.1", **kw: Any) -> TestServer:
        made.append(TestServer(host, **kw))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def worker(store) -> Iterator[BusWorker]:
    w = BusWorker(store, threads=2).start()
    yield w
    w.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def private_redis() -> Iterator[str]:
    """A redis-server of this test alone (tests that fill memory must not disturb the shared one)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="bus-redis-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_for(lambda: connect_redis_url(url).ping(), interval=0.05, ignoring=Exception,
                 what=f"Redis at {url}")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def connect_redis_url(url: str):
    from switchyard.core.config import Connections

    return connect_redis(Connections(redis_url=url))
