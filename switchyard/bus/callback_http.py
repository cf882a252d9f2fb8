"""The HTTP client a delivery thread posts batches with: urllib3 connections whose socket is opened
to an address ``callbacks.AddressPolicy`` checked (TLS SNI, certificate and ``Host`` use the name),
no redirects followed, at most a few KB of the answer read, and one wall-clock deadline per
delivery that covers connecting, sending and every byte of the answer.

Why not ``requests``: it follows redirects by default, reads the whole answer into memory, and its
timeouts are per socket operation, so an answer dripping one byte every 0.5 s held a delivery 8 s
against a 2 s setting (issue 23). Why a watchdog: no per-read timeout can bound the total, so a
single process-wide thread shuts the socket of a delivery whose deadline passed, which ends any
read or write blocked on it at once.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import heapq
import itertools
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import certifi
from urllib3.connection import HTTPConnection, HTTPSConnection

from switchyard.bus.callbacks import AddressPolicy, CallbackTarget
from switchyard.bus.errors import CallbackError

USER_AGENT = "switchyard-bus"
MAX_ORIGINS = 16  # keep-alive connections one delivery thread keeps (one per callback origin)


class _Alarm:
    __slots__ = ("action", "cancelled", "fired")

    def __init__(self, action: Callable[[], None]) -> None:
        self.action, self.cancelled, self.fired = action, False, False


class Watchdog:
    """Runs an action when its time comes unless cancelled first; one thread for every delivery.
    Actions run under the lock, so once ``cancel`` returns the action has run or never will."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, _Alarm]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, at: float, action: Callable[[], None]) -> _Alarm:
        """Run ``action`` at ``at`` (``time.monotonic()``); it must be quick and not raise."""
        alarm = _Alarm(action)
        with self._cv:
            heapq.heappush(self._heap, (at, next(self._seq), alarm))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bus-deadlines", daemon=True)
                self._thread.start()
            self._cv.notify()
        return alarm

    def cancel(self, alarm: _Alarm) -> bool:
        """Cancel ``alarm``; True if its action had already run."""
        with self._cv:
            alarm.cancelled = True
            return alarm.fired

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cv.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cv.wait(delay)
                    continue
                alarm = heapq.heappop(self._heap)[2]
                alarm.fired = True
                alarm.action()


WATCHDOG = Watchdog()


class _Checked:
    """Connects to an address the policy checked, never to a second resolution of the name; the
    lookup and each connect get what is left of ``connect_by`` (monotonic), at most ``timeout``."""

    policy: AddressPolicy
    connect_by: float = float("inf")

    def _budget(self) -> float:
        return max(0.001, min(self.timeout, self.connect_by - time.monotonic()))  # type: ignore[attr-defined]

    def _new_conn(self) -> socket.socket:
        last: OSError | None = None
        for address in self.policy.addresses(self._dns_host, self.port, self._budget()):  # type: ignore[attr-defined]
            try:
                sock = socket.create_connection((address, self.port), self._budget())  # type: ignore[attr-defined]
            except OSError as exc:
                last = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        raise CallbackError(f"cannot connect to {self._dns_host}:{self.port}: {last}")  # type: ignore[attr-defined]


class CheckedHTTPConnection(_Checked, HTTPConnection):
    """Plain HTTP to a checked address (local runs and tests, with SWITCHYARD_BUS_ALLOW_HTTP_CALLBACKS)."""


class CheckedHTTPSConnection(_Checked, HTTPSConnection):
    """HTTPS to a checked address; SNI and the certificate's name check use the URL's host."""


def _shut(conn: HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # the plain socket's shutdown: safe beside a TLS read
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """One context for every delivery thread (it is thread-safe; each loads the CA bundle once):
    certifi's CAs, as ``requests`` used, certificates and names verified."""
    return ssl.create_default_context(cafile=certifi.where())


class CallbackClient:
    """One delivery thread's client: ``post`` a batch, get the status; keeps one keep-alive
    connection per callback origin (at most ``MAX_ORIGINS``). Not thread-safe: one per thread."""

    def __init__(self, policy: AddressPolicy, *, connect_timeout_s: float, deadline_s: float,
                 max_response_bytes: int, ssl_context: ssl.SSLContext | None = None,
                 watchdog: Watchdog = WATCHDOG) -> None:
        self.policy = policy
        self.connect_timeout_s, self.deadline_s = connect_timeout_s, deadline_s
        self.max_response_bytes = max_response_bytes
        self.ssl_context = ssl_context or default_ssl_context()
        self.watchdog = watchdog
        self._conns: OrderedDict[tuple[str, str, int], HTTPConnection] = OrderedDict()

    def _connection(self, target: CallbackTarget) -> HTTPConnection:
        conn = self._conns.pop(target.origin, None)
        if conn is not None and not conn.is_connected:
            conn.close()
            conn = None
        if conn is None:
            if target.scheme == "https":
                conn = CheckedHTTPSConnection(target.host, target.port, ssl_context=self.ssl_context)
            else:
                conn = CheckedHTTPConnection(target.host, target.port)
            conn.policy = self.policy
        self._conns[target.origin] = conn
        while len(self._conns) > MAX_ORIGINS:
            self._conns.popitem(last=False)[1].close()
        return conn

    def post(self, target: CallbackTarget, body: bytes, username: str) -> int:
        """POST ``body`` (JSON) with Basic ``username:x``; the answer's status, redirects included
        (never followed). Raises CallbackError (refused address, deadline) or a urllib3/OS error."""
        started = time.monotonic()
        conn = self._connection(target)
        alarm = self.watchdog.arm(started + self.deadline_s, lambda: _shut(conn))
        reusable = False
        try:
            if conn.sock is None:
                conn.timeout = min(self.connect_timeout_s, self.deadline_s)
                conn.connect_by = started + self.deadline_s  # type: ignore[attr-defined]
                conn.connect()
            conn.timeout = max(0.001, self.deadline_s - (time.monotonic() - started))
            auth = base64.b64encode(f"{username}:x".encode()).decode()
            conn.request("POST", target.request_uri, body=body, preload_content=False, decode_content=False,
                         headers={"User-Agent": USER_AGENT, "Content-Type": "application/json",
                                  "Authorization": f"Basic {auth}", "Accept-Encoding": "identity"})
            response = conn.getresponse()
            head = response.read(self.max_response_bytes + 1, decode_content=False)
            reusable = len(head) <= self.max_response_bytes and response.isclosed()
            status = response.status
        except Exception as exc:
            if self.watchdog.cancel(alarm):
                raise CallbackError(f"no answer within the {self.deadline_s:g} s deadline") from exc
            raise
        finally:
            if self.watchdog.cancel(alarm) or not reusable:
                conn.close()
                self._conns.pop(target.origin, None)
        if self.watchdog.cancel(alarm):
            raise CallbackError(f"no answer within the {self.deadline_s:g} s deadline")
        return status

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
