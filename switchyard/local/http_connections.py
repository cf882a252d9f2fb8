"""The local gateway's connections on waitress's I/O loop: slow clients cannot keep others out.

A request head is read by the loop, never by a worker thread; a head that takes longer than the
head timeout is cut (``cut_slow_heads``), and at the connection limit a new client closes a
connection that holds no request instead of waiting (``ShedAtTheLimit``). ``Channel`` is
waitress's channel with the time its head began, less a busy wait of the loop.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from waitress.channel import HTTPChannel

logger = logging.getLogger(__name__)

ACCEPTS_PER_TURN = 64  # connections the I/O loop accepts at once


class Channel(HTTPChannel):
    """Waitress's channel, less a busy wait of its I/O loop while a task thread sends a response,
    and with the time its request head began (``cut_slow_heads`` closes it past the head timeout).

    The task thread sends its response itself, holding the channel's output lock. Meanwhile
    waitress's ``writable()`` says yes (output is buffered), the socket is always ready for
    writing, and the loop's non-blocking attempt at the lock fails: it turns again, holding the
    GIL the task thread needs to finish. Measured: ~100 loop turns and ~1.5 ms of CPU per bus
    publish, half the process's CPU. While the lock is held the task will send the data, or pull
    the trigger if it cannot (then the lock is free and the loop sends it).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_started: float | None = self.creation_time  # a new connection owes its first head

    def received(self, data: bytes) -> bool:
        """Waitress's parsing; then when the head being read began, or None (no head in progress:
        between requests, or reading a body)."""
        in_head = self.request is not None and not self.request.headers_finished
        result = super().received(data)
        if self.request is not None and not self.request.headers_finished:
            if not in_head:
                self.head_started = time.time()
        else:
            self.head_started = None
        return bool(result)

    def writable(self) -> bool:
        if self.requests and self.total_outbufs_len and not (self.will_close or self.close_when_flushed):
            if not self.outbuf_lock.acquire(False):
                return False
            self.outbuf_lock.release()
        return bool(super().writable())


def cut_slow_heads(server: Any, head_timeout_s: float) -> Callable[[float], None]:
    """Waitress's maintenance (idle channels), then: close each connection whose request head has
    taken longer than ``head_timeout_s`` (logged and counted in ``server.heads_cut``)."""
    idle_maintenance = server.maintenance
    server.heads_cut = 0

    def maintenance(now: float) -> None:
        idle_maintenance(now)
        cutoff, cut = now - head_timeout_s, 0
        for channel in list(server.active_channels.values()):
            started = getattr(channel, "head_started", None)
            if started is not None and started < cutoff and not channel.requests and not channel.will_close:
                channel.will_close = True
                cut += 1
        if cut:
            server.heads_cut += cut
            logger.info("closed %d connection(s) whose request head took over %g s (%d in all)",
                        cut, head_timeout_s, server.heads_cut)

    return maintenance


def _shed_rank(channel: Any) -> tuple[int, float]:
    """Which connection goes first at the limit: an incomplete head, the oldest first; then an idle
    keep-alive connection (or one sending a body), the longest silent first."""
    started = getattr(channel, "head_started", None)
    return (0, started) if started is not None else (1, channel.last_activity)


class ShedAtTheLimit:
    """At the connection limit, a new client closes the connection that holds no request (no handler
    running or queued for it) ranked first by ``_shed_rank``, instead of waiting in the backlog.

    Waitress stops polling its listener at the limit, so 1,000 connections dripping a head kept
    every new client out until the head timeout cut them. Here the listener stays polled while some
    connection holds no request; one that holds a request is never closed (if all do, new clients
    wait in the backlog, as with waitress). The shed connection is shut down at once, so the loop
    closes it on its next turn whatever its buffers hold; counted in ``server.shed``, logged.
    """

    def __init__(self, server: Any) -> None:
        self.server = server
        self.accept = server.handle_accept
        self.closing: set[Any] = set()  # shed, not yet closed by the loop
        self.logged = 0
        self.backlogged = False  # full of requests: new clients wait (logged once per episode)
        server.shed = 0
        server.readable, server.handle_accept = self.readable, self.handle_accept

    def sheddable(self) -> Iterable[Any]:
        return (c for c in self.server.active_channels.values() if not c.requests and c not in self.closing)

    def full(self) -> bool:
        self.closing = {c for c in self.closing if c._fileno is not None}
        return len(self.server._map) - len(self.closing) >= self.server.adj.connection_limit

    def readable(self) -> bool:
        """Waitress's listener ``readable`` (maintenance, not at the limit), or at the limit while
        something can be shed."""
        server, now = self.server, time.time()
        if now >= server.next_channel_cleanup:
            server.next_channel_cleanup = now + server.adj.cleanup_interval
            server.maintenance(now)
            self.log()
        if not server.accepting:
            return False
        backlogged = self.full() and not any(True for _ in self.sheddable())
        if backlogged and not self.backlogged:
            logger.warning("at the connection limit (%d) with a request on every connection: new clients "
                           "wait", server.adj.connection_limit)
        self.backlogged = backlogged
        return not backlogged

    def handle_accept(self) -> None:
        """Accept what waits (up to ``ACCEPTS_PER_TURN``, not waitress's one per loop turn: at the
        limit each turn costs a pass over every connection), shedding one connection for each."""
        victims: list[Any] | None = None
        for _ in range(ACCEPTS_PER_TURN):
            full = self.full()
            if full and victims is None:
                victims = sorted(self.sheddable(), key=_shed_rank, reverse=True)
            if full and not victims:
                return  # every connection holds a request: the client waits in the backlog
            open_before = len(self.server._map)
            self.accept()
            if len(self.server._map) == open_before:
                return  # no one else waiting
            if full and victims:
                self.shed(victims.pop())

    def shed(self, channel: Any) -> None:
        channel.will_close = True
        with contextlib.suppress(OSError):
            channel.socket.shutdown(socket.SHUT_RDWR)
        self.closing.add(channel)
        self.server.shed += 1

    def log(self) -> None:
        shed = self.server.shed
        if shed > self.logged:
            logger.info("at the connection limit (%d), closed %d connection(s) holding no request for new "
                        "ones (%d in all)", self.server.adj.connection_limit, shed - self.logged, shed)
            self.logged = shed
