"""A node's one pub/sub connection, read by whichever thread is waiting for a message on it.

Part of the Redis adapter: ``store.py`` makes it (``RedisStore.listen``); the services see the
``Subscriber`` port.

Why: a listener thread used to read it and wake the caller a response was for: a thread hand-off
on the path of every call, a large share of a fast call's latency with the GIL. (Pollers wait in
a blocking pop on a connection of their own, not here.) Now a thread about to block for a message
takes the reader role if it is free and reads the connection itself, dispatching whatever arrives
(other threads' messages too: it wakes them), until its own wake-up or its timeout; so one call
at a time crosses no hand-off. A thread that finds the role taken blocks on its signal as before;
when the reader stops, it offers the role to one of them, which reads next.

The listener thread reads only when no thread waits and none began to for a whole tick (it reads
cancellations of requests being processed, subscriptions, and keeps Redis's buffer for this
connection drained), and offers the role to a waiter as soon as one comes. It also replaces the
connection when redis-py gave up on it after its retries (``on_lost`` first); the reconnection's
subscribe confirmations make every waiter check Redis again, as before.

An offer and a waiter's own event may wake it as one (a signal is one bit), so a waiter tells
them apart with its ``ready`` test (its state, written before its signal is set): ready, it
returns and offers the role on; not, it takes the role. No wake-up is lost either way.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.client import PubSub
from redis.cluster import RedisCluster

from switchyard.core.redis_client import RedisClient
from switchyard.pending.wakeup import Signal

logger = logging.getLogger(__name__)

TICK_S = 0.05  # longest single read: a new subscription waits at most this for the reader


class SharedSubscriber:
    """The pub/sub connection of one node; ``dispatch`` gets each message, on the reading thread."""

    def __init__(self, client: RedisClient, channel: str, dispatch: Callable[[dict[str, Any]], None],
                 on_lost: Callable[[], None], retry_interval_s: float, closed: threading.Event) -> None:
        self._client = client
        self._dispatch = dispatch
        self._on_lost = on_lost
        self._retry_interval_s = retry_interval_s
        self._closed = closed
        self._lock = threading.Lock()  # guards the lists and counts below, and the role's moves
        self._role = threading.Lock()  # held by the thread reading the connection
        self._pubsub: PubSub | None = None
        self._channels = [channel]  # subscribed on every new connection (redis-py's own reconnects
        self._unsent: list[str] = []  # re-subscribe by themselves); those not yet on the current one
        self._idle: list[Signal] = []  # waiters blocked on their signal while another thread reads
        self._waiting = 0  # threads inside wait()
        self._entries = 0  # waits begun, ever: the listener reads after a tick in which none began
        self._listener_wake = Signal()

    def subscribe(self, channel: str) -> None:
        """Add a channel; the reader subscribes it before its next read (within a tick)."""
        with self._lock:
            self._channels.append(channel)
            self._unsent.append(channel)

    # ------------------------------------------------------------ waiters

    def wait(self, signal: Signal, timeout: float, ready: Callable[[], bool]) -> bool:
        """Block until ``signal`` is set (True) or ``timeout`` s passed (False), reading the
        connection meanwhile when no other thread does. ``ready``: whether the waiter's event came
        (written before ``signal`` is set). A True may be spurious; the waiter checks its state."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._waiting += 1
            self._entries += 1
        try:
            while True:
                with self._lock:
                    reading = self._pubsub is not None and self._role.acquire(blocking=False)
                    if not reading:
                        self._idle.append(signal)
                if reading:
                    try:
                        outcome = self._read_until(signal, deadline)
                    finally:
                        self._release()
                    if outcome is not None:
                        return outcome
                    continue  # the connection was lost: wait on the signal until it is back
                remaining = deadline - time.monotonic()
                woken = remaining > 0 and signal.wait(remaining)
                with self._lock:
                    offered = signal not in self._idle  # an offer takes the waiter off the list
                    if not offered:
                        self._idle.remove(signal)
                if not offered:
                    return woken
                if not woken or ready():  # not reading after all: the next waiter may
                    with self._lock:
                        self._offer()
                    return woken
        finally:
            with self._lock:
                self._waiting -= 1

    def _read_until(self, signal: Signal, deadline: float) -> bool | None:
        """Read (role held) until ``signal`` is set or the deadline; None if the connection went."""
        while True:
            if signal.wait(0):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if not self._read(min(remaining, TICK_S)):
                return None

    def _release(self) -> None:
        with self._lock:
            self._role.release()
            self._offer()

    def _offer(self) -> None:
        """(Lock held.) If the role is free, wake a waiter to take it: the first one not already
        being woken (that one may be done waiting), else the first."""
        if not self._idle or self._role.locked():
            return
        chosen = next((s for s in self._idle if not s.is_set()), self._idle[0])
        self._idle.remove(chosen)
        chosen.set()

    # ------------------------------------------------------------- reading

    def _read(self, timeout: float) -> bool:
        """One read (role held): subscribe new channels, dispatch what arrives within ``timeout``.
        False when the connection is gone (redis-py gave up after its retries)."""
        pubsub = self._pubsub
        if pubsub is None:
            return False
        unsent: list[str] = []
        if self._unsent:  # read without the lock first: a read per message, new channels are rare
            with self._lock:
                unsent, self._unsent = self._unsent, []
        try:
            if unsent:
                pubsub.subscribe(*unsent)
            message = pubsub.get_message(timeout=timeout)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            logger.warning("pending queue pub/sub connection lost (%s); reconnecting", exc)
            with self._lock:
                self._pubsub = None
            pubsub.close()
            self._on_lost()
            self._listener_wake.set()
            return False
        if message is not None:
            try:
                self._dispatch(message)
            except Exception:  # a malformed message must not fail the waiter that read it
                logger.exception("pending queue could not handle a pub/sub message: %r", message)
        return True

    # ------------------------------------------------------------ listener

    def run(self) -> None:
        """The listener thread: connect, read while nobody waits, reconnect; until closed."""
        seen = 0  # waits begun when the listener last looked
        failed = False
        while not self._closed.is_set():
            if self._pubsub is None:
                if failed:
                    self._closed.wait(self._retry_interval_s)
                failed = not self._connect()
                continue
            with self._lock:
                self._offer()  # waiters that waited for the connection to come back
                reading = self._quiet(seen) and self._role.acquire(blocking=False)
                seen = self._entries
            if not reading:
                self._listener_wake.wait(TICK_S)
                continue
            try:
                while not self._closed.is_set() and self._read(TICK_S):
                    with self._lock:
                        if not self._quiet(seen):
                            break
            finally:
                self._release()
        # Closed: a waiter still reading ends within a tick (close() woke every waiter).
        if self._role.acquire(timeout=1.0) and self._pubsub is not None:
            self._pubsub.close()
            self._pubsub = None

    def _quiet(self, seen: int) -> bool:
        """(Lock held.) No thread waits, and none began to since ``seen`` waits had begun."""
        return self._waiting == 0 and self._entries == seen

    def _connect(self) -> bool:
        """A new connection subscribed to every channel (those added meanwhile come next read)."""
        pubsub = self._client.pubsub()
        with self._lock:
            channels, self._unsent = list(self._channels), []
        try:
            pubsub.subscribe(*channels)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            logger.warning("pending queue could not subscribe (%s); retrying", exc)
            pubsub.close()
            if isinstance(self._client, RedisCluster):  # its node failed: ask the cluster for the new one
                with contextlib.suppress(redis.RedisError):
                    self._client.nodes_manager.initialize()
            return False
        self._pubsub = pubsub
        return True
