"""The slotted RPC client (the slotted client design) for keyed pools (the keyed RPC design).

One connection, one channel and one reply queue per client, driven by a background I/O thread, or
by a thread in ``call`` when no other thread drives it (``io_loop``).
Every public method is thread-safe. ``submit`` returns a ``concurrent.futures.Future`` (asyncio code
uses ``AsyncRpcClient``, the same core); ``call`` blocks for the response; ``send`` publishes a
request that expects no response (the keyed RPC design: no reply-to) and its future resolves once the broker
has it. Futures complete in the thread driving the connection (the I/O thread, or a thread in
``call``): their done-callbacks must not block, but they may call ``submit``, ``send`` and ``close``.

When all slots are taken, ``submit`` waits for one to free up, at most the call's timeout, then
raises ``ClientBusyError`` (called from a done-callback, it raises at once instead of waiting).

A bad call fails alone: ``submit`` validates and encodes the request in the caller's thread and
raises a clear error there (``InvalidNameError`` for a key, ``TypeError`` / ``ValueError`` for a
body, headers, timeout or expiration), before it takes a slot. Nothing but a broker failure ends
the I/O loop; anything else fails the calls in flight and the client goes on.

A lost connection fails no call that a new one can still take before its deadline: the I/O thread
reconnects (``SWITCHYARD_AMQP_URL`` may list a cluster's nodes) and re-sends the calls in flight,
at-least-once; one it cannot re-send in time fails with ``CallInterruptedError`` (see ``resend``).

The I/O thread runs a ``_ClientCore`` and never holds the ``RpcClient`` itself, so a client that is
dropped without ``close()`` is garbage collected, and a finalizer then closes its core: the thread
ends, the connection closes and the broker deletes the reply queue. Calls in flight keep their
client alive through their futures' callbacks only.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from switchyard.rpc.client.io_loop import _ClientCore
from switchyard.rpc.client.response import ClientStats, Response
from switchyard.rpc.client.schedule import CallScheduler, When, collect
from switchyard.rpc.settings import RpcSettings


class RpcClient:
    """Calls workers of one pool by key. See the module docstring for threading and reclaim rules."""

    def __init__(
        self,
        pool: str,
        settings: RpcSettings | None = None,
        *,
        concurrency: int | None = None,
        timeout: float | None = None,
        confirm: bool = False,
        name: str = "switchyard-client",
    ) -> None:
        settings = settings or RpcSettings.from_env()
        self._core = _ClientCore(pool, settings, concurrency, timeout, confirm, name)
        # Runs once: at close(), when the client is garbage collected, or at interpreter exit.
        self._finalizer = weakref.finalize(self, self._core.close)
        self._scheduler: CallScheduler | None = None  # made by the first schedule()
        self._scheduler_lock = threading.Lock()

    @property
    def pool(self) -> str:
        return self._core.pool

    @property
    def settings(self) -> RpcSettings:
        return self._core.settings

    @property
    def default_timeout(self) -> float:
        return self._core.default_timeout

    @property
    def stats(self) -> ClientStats:
        return self._core.stats

    @property
    def in_flight(self) -> int:
        return self._core.slots.in_use()

    def submit(
        self,
        key: str,
        body: bytes | str = b"",
        *,
        timeout: float | None = None,
        expiration_ms: int | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> Future[Response]:
        """Send a request; the future resolves to a ``Response`` or fails with an ``RpcError``.

        ``expiration_ms`` defaults to the timeout: a request nobody waits for anymore expires in
        its queue instead of being worked on (0: no expiration). A malformed request raises here,
        for this caller only.
        """
        return self._core.submit(key, body, timeout, expiration_ms, headers).future

    def send(
        self,
        key: str,
        body: bytes | str = b"",
        *,
        timeout: float | None = None,
        expiration_ms: int = 0,
        headers: Mapping[str, Any] | None = None,
    ) -> Future[None]:
        """Send a request that expects no response: published without reply-to (the keyed RPC design).

        The future resolves to None once the broker has the request: when it confirms it on a
        ``confirm=True`` client, else once it is written. It fails like ``submit``'s on a nack, a
        return or a lost connection, and with ``CallTimeoutError`` if no confirm came within
        ``timeout``. ``expiration_ms`` defaults to 0 (the request waits for a worker however long).
        """
        return self._core.submit(key, body, timeout, expiration_ms, headers, reply=False).future

    def call(self, key: str, body: bytes | str = b"", *, timeout: float | None = None,
             expiration_ms: int | None = None, headers: Mapping[str, Any] | None = None) -> Response:
        """Send a request and wait for its response (raises ``CallTimeoutError`` on timeout).

        When no other thread is using the connection, this thread publishes the request and takes
        the response itself (no hand-off to the I/O thread and back).
        """
        return self._core.call(key, body, timeout, expiration_ms, headers)

    def schedule(self, key: str, body: bytes | str = b"", *, at: When = 0, reply: str | None = None,
                 call_id: str | None = None, expiration_ms: int | None = None) -> Future[str]:
        """Call ``key`` at ``at`` (a datetime, an ISO-8601 string or seconds from now; a past one runs
        at once), through the delay scheduler. The future resolves to the call's id once Kafka has
        it. ``reply``: the durable reply queue its answer goes to (``collect`` reads it), None: no
        answer, as ``send``. See ``switchyard.rpc.client.schedule``."""
        with self._scheduler_lock:
            if self._scheduler is None:
                self._scheduler = CallScheduler(self.pool, self.settings)
                self._finalizer_scheduler = weakref.finalize(self, self._scheduler.close)
        return self._scheduler.schedule(key, body, at=at, reply=reply, call_id=call_id,
                                        expiration_ms=expiration_ms)

    def collect(self, reply: str, ids: Iterable[str] | None = None,
                timeout: float = 0.0) -> dict[str, Response]:
        """The answers in the durable reply queue ``reply``, by call id: those of ``ids`` (waiting up to
        ``timeout`` s for them), or all there now. Taken answers leave the queue."""
        return collect(self.settings, reply, ids, timeout)

    def close(self) -> None:
        """Fail calls still in flight with ``ClientClosedError`` and close the connection.

        Safe from any thread, a done-callback included (it then does not wait for the I/O thread).
        """
        self._finalizer()
        with self._scheduler_lock:
            if self._scheduler is not None:
                self._finalizer_scheduler()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
