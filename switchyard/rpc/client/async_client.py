"""``AsyncRpcClient``: the slotted client for asyncio applications (FastAPI, aiohttp).

A thin layer over the blocking client's core (``io_loop._ClientCore``): the same connection, reply
queue, slots, correlation ids, re-sends after a lost connection, confirms and errors, driven by the
core's I/O thread; each call's future is handed to the event loop with ``loop.call_soon_threadsafe``.
Not a second, native asyncio implementation: the protocol's rules live once, in the core, and the
blocking client's tests hold for both.

Nothing waits on the loop's thread: a call waits for a free slot on the loop (an
``asyncio.Semaphore`` as large as the slot table, released only after the core freed the slot;
``ClientBusyError`` when none freed within the call's timeout), and for its answer on an asyncio
future. A task cancelled while it waits frees its slot at once (``abandon``): a request
still in the outbox is not published, and an answer that comes anyway is counted stale. Opening,
closing, ``schedule`` (its first use of a reply queue declares it) and ``collect`` do blocking I/O,
in a worker thread (``asyncio.to_thread``). A client serves the event loop it was opened on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from switchyard.rpc.client.io_loop import _ClientCore
from switchyard.rpc.client.requests import Call, check_timeout
from switchyard.rpc.client.response import ClientStats, Response
from switchyard.rpc.client.schedule import CallScheduler, When, collect, put_back
from switchyard.rpc.errors import ClientBusyError, ClientClosedError, ClientThreadError
from switchyard.rpc.protocol import validate_pool
from switchyard.rpc.settings import RpcSettings


class AsyncRpcClient:
    """Calls workers of one pool by key, from asyncio. Opened by ``async with`` or ``await open()``
    (or the first call); see the module docstring for waiting and cancellation."""

    def __init__(
        self,
        pool: str,
        settings: RpcSettings | None = None,
        *,
        concurrency: int | None = None,
        timeout: float | None = None,
        confirm: bool = False,
        name: str = "switchyard-async-client",
    ) -> None:
        self._pool = validate_pool(pool)
        self._settings = settings or RpcSettings.from_env()
        self._options = (concurrency, timeout, confirm, name)
        self._core: _ClientCore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._free: asyncio.Semaphore | None = None  # one permit per free slot (see the module)
        self._opening: asyncio.Lock | None = None
        self._closed = False
        self._finalizer: weakref.finalize | None = None
        self._scheduler: CallScheduler | None = None
        self._scheduler_finalizer: weakref.finalize | None = None
        self._scheduler_lock = threading.Lock()

    @property
    def pool(self) -> str:
        return self._pool

    @property
    def settings(self) -> RpcSettings:
        return self._settings

    @property
    def stats(self) -> ClientStats:
        return self._opened().stats

    @property
    def in_flight(self) -> int:
        return 0 if self._core is None else self._core.slots.in_use()

    async def open(self) -> AsyncRpcClient:
        """Connect (in a worker thread) and bind the client to the running loop; idempotent."""
        loop = asyncio.get_running_loop()
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._closed:
                raise ClientClosedError("the client is closed")
            if self._core is None:
                concurrency, timeout, confirm, name = self._options
                core = await asyncio.to_thread(_ClientCore, self._pool, self._settings, concurrency,
                                               timeout, confirm, name)
                self._finalizer = weakref.finalize(self, core.close)
                self._loop, self._free, self._core = loop, asyncio.Semaphore(core.slots.size), core
        return self

    def _opened(self) -> _ClientCore:
        if self._core is None:
            raise ClientClosedError("the client is not open: use `async with` or `await client.open()`")
        return self._core

    async def submit(
        self,
        key: str,
        body: bytes | str = b"",
        *,
        timeout: float | None = None,
        expiration_ms: int | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> asyncio.Future[Response]:
        """Send a request once a slot is free; the future resolves to a ``Response`` or fails with an
        ``RpcError`` (``RpcClient.submit``'s). Cancelling the future frees the call's slot."""
        return await self._start(key, body, timeout, expiration_ms, headers, reply=True)

    async def send(
        self,
        key: str,
        body: bytes | str = b"",
        *,
        timeout: float | None = None,
        expiration_ms: int = 0,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        """Send a request that expects no response; returns once the broker has it (``RpcClient.send``)."""
        await (await self._start(key, body, timeout, expiration_ms, headers, reply=False))

    async def call(self, key: str, body: bytes | str = b"", *, timeout: float | None = None,
                   expiration_ms: int | None = None, headers: Mapping[str, Any] | None = None) -> Response:
        """Send a request and wait for its response (``CallTimeoutError`` on timeout)."""
        # A task cancelled here cancels the future it waits on: that frees the call's slot.
        return await (await self._start(key, body, timeout, expiration_ms, headers, reply=True))

    async def _start(self, key: str, body: bytes | str, timeout: float | None, expiration_ms: int | None,
                     headers: Mapping[str, Any] | None, *, reply: bool) -> asyncio.Future[Any]:
        if self._core is None:
            await self.open()
        core = self._opened()
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            raise ClientThreadError("an AsyncRpcClient serves the event loop it was opened on; open one "
                                    "per loop")
        free = self._free
        assert free is not None  # set with the core
        wait = check_timeout(core.default_timeout if timeout is None else timeout)
        if free.locked():
            try:
                await asyncio.wait_for(free.acquire(), wait)
            except TimeoutError:
                raise ClientBusyError(f"all {core.slots.size} slots stayed busy for {wait:.3g}s; "
                                      "raise the client's concurrency or add workers") from None
        else:
            await free.acquire()  # a free permit: returns at once
        try:
            call = core.submit(key, body, timeout, expiration_ms, headers, reply, slot_wait=0)
        except BaseException:
            free.release()
            raise
        return self._bridge(core, call, loop, free)

    @staticmethod
    def _bridge(core: _ClientCore, call: Call, loop: asyncio.AbstractEventLoop,
                free: asyncio.Semaphore) -> asyncio.Future[Any]:
        """An asyncio future settled from the call's future; cancelling it abandons the call."""
        waiter: asyncio.Future[Any] = loop.create_future()

        def settle(done: Future) -> None:  # on the loop, after the core freed the slot
            free.release()
            if waiter.done():
                return
            if done.cancelled():
                waiter.cancel()
            elif (error := done.exception()) is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(done.result())

        def hand_over(done: Future) -> None:  # in the thread that settled it
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for it
                loop.call_soon_threadsafe(settle, done)

        def on_waiter_done(future: asyncio.Future[Any]) -> None:
            if future.cancelled():
                abandon(core, call)

        call.future.add_done_callback(hand_over)
        waiter.add_done_callback(on_waiter_done)
        return waiter

    async def schedule(self, key: str, body: bytes | str = b"", *, at: When = 0, reply: str | None = None,
                       call_id: str | None = None, expiration_ms: int | None = None) -> str:
        """Call ``key`` at ``at`` through the delay scheduler (``RpcClient.schedule``); returns the call's
        id once Kafka has it. Cancelled after it was produced, the call stays scheduled."""
        future = await asyncio.to_thread(self._scheduled().schedule, key, body, at=at, reply=reply,
                                         call_id=call_id, expiration_ms=expiration_ms)
        return await asyncio.wrap_future(future)

    def _scheduled(self) -> CallScheduler:
        with self._scheduler_lock:
            if self._closed:
                raise ClientClosedError("the client is closed")
            if self._scheduler is None:
                self._scheduler = CallScheduler(self._pool, self._settings)
                self._scheduler_finalizer = weakref.finalize(self, self._scheduler.close)
            return self._scheduler

    async def collect(self, reply: str, ids: Iterable[str] | None = None,
                      timeout: float = 0.0) -> dict[str, Response]:
        """The answers in the durable reply queue ``reply`` by call id (``RpcClient.collect``). Cancelled,
        it puts back the answers it had taken before it returns."""
        wanted = None if ids is None else list(ids)
        stop = threading.Event()
        task = asyncio.ensure_future(asyncio.to_thread(collect, self._settings, reply, wanted, timeout, stop))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            stop.set()
            taken = await task  # within a round trip to the broker
            if taken:
                await asyncio.to_thread(put_back, self._settings, reply, taken.values())
            raise

    async def close(self) -> None:
        """Fail calls still in flight with ``ClientClosedError`` and close the connection."""
        self._closed = True
        for finalizer in (self._finalizer, self._scheduler_finalizer):
            if finalizer is not None and finalizer.alive:
                await asyncio.to_thread(finalizer)

    async def __aenter__(self) -> AsyncRpcClient:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


def abandon(core: _ClientCore, call: Call) -> bool:
    """Free the slot of a call nobody waits for anymore (its task was cancelled) now, not at its
    deadline, and cancel its future: still in the outbox, it is not published; an answer that comes
    anyway is stale (the slot's sequence number moved on). False: it was settled already. The core
    settles every call through ``slots.complete`` too, under the table's lock, so only one side wins."""
    if core.slots.complete(call.slot, call.seq) is None:
        return False
    call.future.cancel()
    return True
