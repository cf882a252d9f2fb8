"""A TCP proxy that cuts every connection through it for a while, or leaves them half-open.

The pending tests cut Redis with it; the fault suite (``tests/faults/cuts.py``) puts it between the
runtime and RabbitMQ, Postgres, Kafka or Redis. Traffic stays on 127.0.0.1 and needs no root.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream; ``silent``: neither side is read or written again."""

    client: socket.socket
    upstream: socket.socket
    silent: threading.Event = field(default_factory=threading.Event)

    def sockets(self) -> tuple[socket.socket, socket.socket]:
        return self.client, self.upstream


class CuttableProxy:
    """Forward 127.0.0.1:port to 127.0.0.1:target_port.

    ``cut(seconds)`` closes every connection (both peers see it at once) and refuses new ones (accepts
    and closes) until the time is up. ``hang(seconds)`` is the half-open connection of a peer that
    vanished without a RST: every connection goes silent for good (nothing read, nothing forwarded,
    both sockets kept open until ``close``), and new ones are accepted and left silent until the time
    is up. Only a peer's own timeouts (heartbeats, read deadlines) can notice a hang: the kernel still
    acknowledges what is sent (as a frozen peer's would), so TCP keepalives do not.
    """

    POLL_S = 0.1  # how soon a pipe notices that its link went silent

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._held: list[socket.socket] = []  # sockets of silent links, closed by ``close``
        self._refuse_until = 0.0
        self._silent_until = 0.0
        self._closed = False
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.port}").start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The Redis URL through the proxy."""
        return f"redis://{self.address}/0"

    def through(self, url: str) -> str:
        """``url`` (a service's) with the proxy's host and port: credentials, path and query kept."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        return urlunsplit(parts._replace(netloc=f"{credentials}@{self.address}" if credentials
                                         else self.address))

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            now = time.monotonic()
            if now < self._refuse_until:
                client.close()
                continue
            if now < self._silent_until:
                with self._lock:
                    self._held.append(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            link = _Link(client, upstream)
            with self._lock:
                self._links.add(link)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(link, a, b), daemon=True).start()

    def _pipe(self, link: _Link, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not link.silent.is_set():
                readable, _, _ = select.select([source], [], [], self.POLL_S)
                if link.silent.is_set():
                    return  # half-open: the sockets stay open, held until ``close``
                if readable:
                    data = source.recv(65536)
                    if not data:
                        break
                    sink.sendall(data)
        except (OSError, ValueError):  # ValueError: select on a socket closed meanwhile
            pass
        if not link.silent.is_set():
            with self._lock:
                self._links.discard(link)
            for s in link.sockets():
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def cut(self, seconds: float) -> None:
        """Drop every connection now and refuse new ones for ``seconds`` (returns at once)."""
        self.cuts += 1
        self._refuse_until = time.monotonic() + seconds
        for link in self._take_links():
            for s in link.sockets():
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def hang(self, seconds: float) -> None:
        """Leave every connection half-open for good, new ones silent for ``seconds`` (returns at once)."""
        self.cuts += 1
        self._silent_until = time.monotonic() + seconds
        for link in self._take_links():
            link.silent.set()
            with self._lock:
                self._held.extend(link.sockets())

    def _take_links(self) -> list[_Link]:
        with self._lock:
            links, self._links = list(self._links), set()
        return links

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut(0)
        self.cuts -= 1
        with self._lock:
            held, self._held = self._held, []
        for s in held:
            s.close()
