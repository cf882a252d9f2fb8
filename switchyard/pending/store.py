"""The Redis adapter of the pending queue (``PendingStore``): the only module of the part that talks
to Redis, with its helpers ``batch.py`` (concurrent script calls share a round trip) and
``subscriber.py`` (the node's one pub/sub connection).

Key layout (each step documented in ``lua/*.lua``): every key of an endpoint carries the Redis
Cluster hash tag ``{<endpoint>}`` (``<prefix>:{E}:pending``, ``<prefix>:{E}:r:<id>``,
``<prefix>:{E}:t:<take id>``, ``<prefix>:{E}:polls``), so each script and each blocking pop touches
one slot. Every multi-step change is one Lua script (enqueue, respond, heartbeat, withdraw, give
back; the claim runs inside respond and heartbeat), idempotent, so redis-py's retries are safe. A
poller waits in a blocking pop (BLMOVE) that moves the whole request from the endpoint's list into
a take key of its own, with its TTL in the same write. redis-py's own Retry repeats every other
command for the retry window (30 s, 1 s apart).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from importlib import resources
from typing import Any, cast

import redis
from redis.backoff import ConstantBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from switchyard.core.redis_client import RedisClient, open_redis
from switchyard.pending.batch import MOVED, ScriptBatcher, packed
from switchyard.pending.errors import PendingError, StoreUnavailableError
from switchyard.pending.ports import (
    Answer,
    AnswerWait,
    CallerBeatReply,
    ProcessorBeatReply,
    ProcessorState,
    RequestState,
    WaitOutcome,
    WithdrawOutcome,
    WithdrawReply,
)
from switchyard.pending.settings import PendingSettings, check_endpoint
from switchyard.pending.store_admin import AdminOps, _ms, _text
from switchyard.pending.subscriber import SharedSubscriber

logger = logging.getLogger(__name__)


def connect_pending_redis(settings: PendingSettings, url: str | None = None) -> RedisClient:
    """A Redis client whose commands are retried by redis-py for the retry window (Halibut's design: 30 s,
    1 s apart), each attempt bounded by ``SWITCHYARD_REDIS_TIMEOUT_S``. Commands are short (no
    blocking reads: pollers pop on connections of their own), so thousands of waiting callers
    share a bounded pool: a thread that finds every connection busy waits for one (up to the retry
    window) instead of failing. On a Redis Cluster (``SWITCHYARD_REDIS_CLUSTER=1``) the pool is per
    node and the cluster client retries, re-reading the slot map (a failover's new master)."""
    timeout = settings.connections.redis_timeout_s
    cluster = settings.connections.redis_cluster
    # (a cluster client retries with no pause: a few attempts, then RedisStore retries for the window)
    return open_redis(
        url or settings.connections.redis_url, cluster,
        Retry(ConstantBackoff(settings.retry_interval_s), retries=3 if cluster else settings.retries),
        pool_class=redis.BlockingConnectionPool,
        max_connections=settings.redis_connections,
        timeout=settings.retry_window_s,
        socket_timeout=timeout,
        socket_connect_timeout=min(timeout, 2.0),
        health_check_interval=30,
    )


def _script(client: RedisClient, name: str, claims: bool = False) -> Any:
    """Register a script; ``claims``: it calls claim() (``lua/claim.lua`` is prepended)."""
    lua = resources.files("switchyard.pending.lua")
    prelude = lua.joinpath("claim.lua").read_text() if claims else ""
    return client.register_script(prelude + lua.joinpath(name).read_text())


TAGS_KEPT = 4096  # endpoints whose key tag a node keeps made
ANSWER_WAITERS = 4  # connections per Redis node for callers' answer-list waits (more: the node channel)
MIN_ANSWER_WAIT_S = 0.01  # a shorter wait is not worth a connection (and BLPOP's 0 is "for ever")


def _raise(error: Exception) -> Any:
    raise error


def _reply(connection: Any) -> Any:
    """The next reply on ``connection``; an error reply returned, not raised (the replies after
    it are still to be read)."""
    try:
        return connection.read_response()
    except redis.ResponseError as exc:
        return exc


def _cut(connection: Any) -> None:
    """End a blocked read on ``connection`` now (redis-py has no public way): its own thread then
    sees the connection fail and disconnects it."""
    sock = connection._sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class RedisStore(AdminOps):
    """One node's pending-queue state in Redis; ``closed`` is the node's (set when it closes).
    ``answer_waiters``: connections per Redis node for answer-list waits (0: every call waits on
    the node channel, as concurrent calls beyond them do)."""

    answer_waiters = ANSWER_WAITERS

    def __init__(self, settings: PendingSettings, node_id: str, closed: threading.Event,
                 client: RedisClient | None = None) -> None:
        self.settings = settings
        self.client = client or connect_pending_redis(settings)
        self.node_id = node_id
        self._closed = closed
        prefix = settings.prefix
        self.node_channel_prefix = f"{prefix}:node:"
        self.node_channel = f"{self.node_channel_prefix}{node_id}"
        self.guard_key = f"{prefix}:guard:{node_id}"
        self._enqueue = _script(self.client, "enqueue.lua")
        self._respond = _script(self.client, "respond.lua", claims=True)
        self._heartbeat = _script(self.client, "heartbeat.lua", claims=True)
        self._withdraw = _script(self.client, "withdraw.lua")
        self._give_back = _script(self.client, "give_back.lua")
        self.batch = ScriptBatcher(self.client)  # enqueues and responds of concurrent threads
        # Blocking pops hold their connection for up to a poll wait: each polling thread has a
        # connection of its own (the same server and options; no cap but the server's maxclients),
        # held while the thread lives, so pollers never starve callers of the bounded pool. On a
        # cluster: one per node the thread popped from, made like that node's pool's connections.
        self._cluster = self.client if isinstance(self.client, RedisCluster) else None
        self._guards: tuple[Any, dict[str, tuple[int, int]]] = (None, {})  # slot map -> guard key: slots
        self._pop_block_s = max(settings.poll_wait_s, settings.http_poll_wait_s)
        # A take key outlives the longest pop plus a retry window (its request is claimed long before)
        self._take_ttl_ms = _ms(self._pop_block_s + settings.retry_window_s + 90)
        self._poll_timeout_s = self._pop_block_s + settings.connections.redis_timeout_s
        self._poller = threading.local()
        self._lock = threading.Lock()
        self._poll_connections: weakref.WeakSet[Any] = weakref.WeakSet()  # interrupt_pops() cuts them
        self._tags: dict[str, str] = {}  # endpoint -> its key tag
        # Answer-list waits: a caller's enqueue and its blocking pop for the response go in one
        # write on a connection of these (idle ones by node name; how many each node has made);
        # ``_waits``: request id -> the connection its wait blocks on (``interrupt_wait``).
        self._answer_timeout_s = settings.heartbeat_initial_delay_s + settings.connections.redis_timeout_s
        self._idle_waiters: dict[str, list[Any]] = {}
        self._waiters_made: dict[str, int] = {}
        self._waits: dict[str, Any] = {}

    def _available(self, operation: Callable[[], Any]) -> Any:
        """Run a Redis operation; map its failure. On one server redis-py already retried it for
        the window. A cluster client's retries re-read the slot map back to back, with no pause, so
        they are spent before a failover ends (the node timeout): here the operation is retried
        for the window, ``retry_interval_s`` apart (every script is idempotent)."""
        give_up: float | None = None
        while True:
            try:
                return operation()
            except (redis.ConnectionError, redis.TimeoutError, *MOVED) as exc:
                if self._cluster is None and isinstance(exc, MOVED):
                    raise PendingError(f"Redis refused the command: {exc}") from exc
                now = time.monotonic()
                give_up = give_up or now + (0 if self._cluster is None else self.settings.retry_window_s)
                if now >= give_up or self._closed.is_set():
                    raise StoreUnavailableError(f"Redis unreachable after retrying: {exc}") from exc
                self._closed.wait(self.settings.retry_interval_s)
            except redis.RedisError as exc:  # refused (out of memory, a key of the wrong type...)
                raise PendingError(f"Redis refused the command: {exc}") from exc

    # ------------------------------------------------------------------ keys

    def key_tag(self, endpoint: str) -> str:
        """Every key of one endpoint shares this Redis Cluster hash tag (one slot per endpoint).
        Kept per endpoint (each call names its endpoint's keys several times), a bounded few."""
        tag = self._tags.get(endpoint)
        if tag is None:
            if len(self._tags) >= TAGS_KEPT:
                self._tags.clear()
            tag = self._tags[endpoint] = f"{self.settings.prefix}:{{{check_endpoint(endpoint)}}}"
        return tag

    def state_key(self, endpoint: str, request_id: str) -> str:
        return f"{self.key_tag(endpoint)}:r:{request_id}"

    def pending_key(self, endpoint: str) -> str:
        return f"{self.key_tag(endpoint)}:pending"

    def take_key(self, endpoint: str, take_id: str) -> str:
        return f"{self.key_tag(endpoint)}:t:{take_id}"

    def polls_key(self, endpoint: str) -> str:
        return f"{self.key_tag(endpoint)}:polls"

    def answer_key(self, endpoint: str, request_id: str) -> str:
        return f"{self.key_tag(endpoint)}:a:{request_id}"

    def endpoint_channel(self, endpoint: str) -> str:
        """Cancellations of an endpoint's popped, not yet claimed requests (processor unknown)."""
        return f"{self.settings.prefix}:ep:{endpoint}"

    def listen(self, dispatch: Callable[[dict[str, Any]], None],
               on_lost: Callable[[], None]) -> SharedSubscriber:
        return SharedSubscriber(self.client, self.node_channel, dispatch, on_lost,
                                self.settings.retry_interval_s, self._closed)

    # --------------------------------------------------------- caller's side

    def enqueue(self, endpoint: str, request_id: str, element: bytes, pickup_timeout_s: float) -> None:
        s = self.settings
        self._available(lambda: self.batch.call(
            self._enqueue, [self.state_key(endpoint, request_id), self.pending_key(endpoint)],
            [element, self.node_id, _ms(pickup_timeout_s + s.request_ttl_extra_s),
             _ms(s.pending_list_ttl_s), "0"]))

    def enqueue_and_wait(self, endpoint: str, request_id: str, element: bytes, pickup_timeout_s: float,
                         wait_s: float, ready: Callable[[], bool], queued: Callable[[], None]) -> AnswerWait:
        """The enqueue script and a BLPOP on the call's answer list in one write: the response
        comes back on this connection (respond.lua pushes it there), the way the raw lists' caller
        gets its reply, with no pub/sub read. Anything unusual (no waiting connection free, a
        failure, an interruption) falls back to the plain enqueue (idempotent), which retries."""
        s = self.settings
        pending = self.pending_key(endpoint)
        waiter = self._waiter(pending) if wait_s >= MIN_ANSWER_WAIT_S else None
        if waiter is None:
            self.enqueue(endpoint, request_id, element, pickup_timeout_s)
            queued()
            return AnswerWait(WaitOutcome.NOT_WAITED)
        name, connection = waiter
        outcome, response, enqueued = WaitOutcome.NOT_WAITED, None, False
        with self._lock:
            self._waits[request_id] = connection
        try:
            if not ready():  # (an interruption from now on cuts the connection: the pop ends)
                outcome = WaitOutcome.BROKEN
                args = (element, self.node_id, _ms(pickup_timeout_s + s.request_ttl_extra_s),
                        _ms(s.pending_list_ttl_s), "1")
                state = self.state_key(endpoint, request_id)
                connection.send_packed_command(packed(
                    connection, ("EVALSHA", self._enqueue.sha, 2, state, pending, *args),
                    ("BLPOP", self.answer_key(endpoint, request_id), f"{wait_s:.3f}")))
                if isinstance(_reply(connection), Exception):  # (not loaded, moved...): the pop ends
                    connection.disconnect()
                else:
                    enqueued = True
                    queued()
                    popped = _reply(connection)
                    if popped is None:
                        outcome = WaitOutcome.TIMED_OUT
                    elif not isinstance(popped, Exception):
                        outcome, response = WaitOutcome.ANSWERED, popped[1]
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            connection.disconnect()  # (the next wait connects it again)
        finally:
            with self._lock:
                self._waits.pop(request_id, None)
                self._idle_waiters[name].append(connection)
        if not enqueued:
            self.enqueue(endpoint, request_id, element, pickup_timeout_s)
            queued()
        return AnswerWait(outcome, response)

    def interrupt_wait(self, request_id: str) -> None:
        with self._lock:
            connection = self._waits.get(request_id)
            if connection is not None:
                _cut(connection)

    def _waiter(self, key: str) -> tuple[str, Any] | None:
        """A connection for an answer-list wait on ``key``'s node, connected; None if all are busy."""
        name, pool = self._node_pool(key)
        with self._lock:
            idle = self._idle_waiters.setdefault(name, [])
            if idle:
                connection = idle.pop()
            elif self._waiters_made.get(name, 0) < self.answer_waiters:
                self._waiters_made[name] = self._waiters_made.get(name, 0) + 1
                connection = pool.connection_class(
                    **{**pool.connection_kwargs, "socket_timeout": self._answer_timeout_s})
            else:
                return None
        if connection._sock is None:  # (connected before an interruption may look for its socket)
            try:
                connection.connect()
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                with self._lock:
                    idle.append(connection)
                return None
        return name, connection

    def caller_beat(self, endpoint: str, request_id: str, element: bytes) -> CallerBeatReply:
        s = self.settings
        reply = self._available(lambda: self._heartbeat(
            keys=[self.state_key(endpoint, request_id), self.pending_key(endpoint),
                  self.answer_key(endpoint, request_id)],
            args=["c", "", _ms(s.in_flight_ttl_s), element, _ms(s.processor_timeout_s),
                  _ms(s.pending_list_ttl_s)]))
        state = RequestState(_text(reply[0]))
        if state is RequestState.MISSING:
            return CallerBeatReply(state, 0, b"")
        return CallerBeatReply(state, int(reply[1]), reply[2])

    def withdraw(self, endpoint: str, request_id: str, element: bytes, mode: str) -> WithdrawReply:
        reply = self._available(lambda: self._withdraw(
            keys=[self.state_key(endpoint, request_id), self.pending_key(endpoint)],
            args=[request_id, mode, self.node_channel_prefix, element, self.endpoint_channel(endpoint)]))
        return WithdrawReply(WithdrawOutcome(_text(reply[0])), reply[1] if len(reply) > 1 else None)

    def unlink_answered(self, answered: Mapping[str, Sequence[str]]) -> None:
        """One UNLINK per endpoint (its keys share one cluster slot), all in one round trip."""
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for endpoint, request_ids in answered.items():
                    # (execute_command: a cluster pipeline's unlink() splits keys by slot, not queued)
                    pipe.execute_command("UNLINK", *(self.state_key(endpoint, r) for r in request_ids))
                pipe.execute()
        except redis.RedisError:
            logger.warning("could not unlink %d answered states; their TTL will",
                           sum(map(len, answered.values())))

    # ------------------------------------------------------- processing side

    def respond(self, endpoint: str, request_id: str, take_id: str, raw: bytes) -> str:
        return _text(self._available(lambda: self.batch.call(
            self._respond, *self._respond_keys_args(endpoint, request_id, take_id, raw))))

    def _respond_keys_args(self, endpoint: str, request_id: str, take_id: str,
                           raw: bytes) -> tuple[list[Any], list[Any]]:
        s = self.settings
        return ([self.state_key(endpoint, request_id), self.take_key(endpoint, take_id),
                 self.answer_key(endpoint, request_id)],
                [take_id, raw, _ms(s.response_ttl_s), self.node_channel_prefix, _ms(s.sender_timeout_s),
                 request_id, self.node_id, self._take_ttl_ms])

    def processor_beat(self, endpoint: str, request_id: str, take_id: str) -> ProcessorBeatReply:
        reply = self._available(lambda: self._heartbeat(
            keys=[self.state_key(endpoint, request_id), self.take_key(endpoint, take_id)],
            args=["p", take_id, _ms(self.settings.in_flight_ttl_s), request_id, self.node_id,
                  self._take_ttl_ms]))
        state = ProcessorState(_text(reply[0]))
        if state is not ProcessorState.TAKEN:
            return ProcessorBeatReply(state, 0, False)
        return ProcessorBeatReply(state, int(reply[1]), bool(int(reply[2])))

    def pop(self, endpoint: str, take_id: str, deadline: float, answer: Answer | None = None) -> bytes | None:
        """Move the next request of ``endpoint`` into the take key (blocking until ``deadline``).

        BLMOVE and the take key's PEXPIRE go in one write: Redis runs the PEXPIRE right after the
        move, so the moved request is never in a key without a TTL. ``answer`` (the serving loop's
        response to its previous request) goes in the same write, first: one round trip where
        respond + pop took two, and the pop is waiting again the moment the response is stored.
        Retried here for the retry window, not by redis-py: after a lost connection the take key
        is read first, since a pop whose reply was lost may have moved a request into it.
        """
        s = self.settings
        pending, take = self.pending_key(endpoint), self.take_key(endpoint, take_id)
        ttl = self._take_ttl_ms
        give_up: float | None = None
        lost = False
        while True:
            connection = self._poll_connection(pending)
            try:
                if self._closed.is_set():
                    return None
                if lost:
                    connection.send_packed_command(packed(connection, ("LINDEX", take, -1),
                                                          ("PEXPIRE", take, ttl)))
                    held = self._read_pop(connection, endpoint)
                    if held is not None:
                        return held
                    lost = False
                wait = min(deadline - time.monotonic(), self._pop_block_s)
                pop: tuple[Any, ...] = ("LMOVE", pending, take, "LEFT", "RIGHT")
                if wait > 0:
                    pop = ("BLMOVE", pending, take, "LEFT", "RIGHT", f"{wait:.3f}")
                # (a connection idle past its health-check interval is pinged, and replaced if stale)
                if answer is None:
                    connection.send_packed_command(packed(connection, pop, ("PEXPIRE", take, ttl)))
                else:
                    keys, args = self._respond_keys_args(endpoint, *answer[:3])
                    connection.send_packed_command(packed(
                        connection, ("EVALSHA", self._respond.sha, len(keys), *keys, *args), pop,
                        ("PEXPIRE", take, ttl)))
                    told = _reply(connection)
                    sent, answer = answer, None
                    if isinstance(told, Exception):  # (not loaded, moved...): the client's own way
                        self._tell(sent, endpoint)
                    else:
                        sent.told(partial(_text, told))
                element = self._read_pop(connection, endpoint)
                if element is not None or deadline - time.monotonic() <= 0:
                    return element
            except (redis.ConnectionError, redis.TimeoutError, OSError, *MOVED) as exc:
                connection.disconnect()
                self._refresh_slots()
                if answer is not None:  # it may have been stored (respond.lua is idempotent)
                    sent, answer = answer, None
                    self._tell(sent, endpoint)
                if self._closed.is_set():  # the node's close interrupted the pop: it may have moved one
                    self._give_back_popped(pending, take)
                    return None
                now = time.monotonic()
                give_up = give_up or now + s.retry_window_s
                if now >= give_up:
                    raise StoreUnavailableError(f"Redis unreachable after retrying: {exc}") from exc
                lost = True
                self._closed.wait(s.retry_interval_s)
            finally:
                if answer is not None:  # not sent (the node closes): sent the usual way
                    sent, answer = answer, None
                    self._tell(sent, endpoint)

    def _tell(self, answer: Answer, endpoint: str) -> None:
        """Send ``answer`` the usual way (batched, retried) and tell its outcome, or its failure."""
        try:
            outcome = self.respond(endpoint, answer.request_id, answer.take_id, answer.raw)
        except PendingError as exc:
            failure = exc
            answer.told(lambda: _raise(failure))
        else:
            answer.told(lambda: outcome)

    @staticmethod
    def _read_pop(connection: Any, endpoint: str) -> bytes | None:
        """The replies of a pop and its PEXPIRE: both are read even if the first is an error
        (WRONGTYPE, OOM...), so the connection's next read gets its own reply."""
        replies = []
        for _ in range(2):
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        for reply in replies:
            if isinstance(reply, MOVED):  # the slot moved (failover): the caller pops there
                raise reply
            if isinstance(reply, redis.ResponseError):
                raise PendingError(f"Redis refused the pop on {endpoint!r}: {reply}") from reply
        return replies[0]

    def _give_back_popped(self, pending: str, take: str) -> None:
        """Return what an interrupted pop moved into ``take`` to the head of ``pending``."""
        try:
            if self._give_back(keys=[pending, take], args=[_ms(self.settings.pending_list_ttl_s)]):
                logger.info("closing: gave a popped request back to %s", pending)
        except redis.RedisError:  # Redis unreachable too: the caller's beat finds it popped
            logger.warning("closing: could not give back what a pop may have moved to %s", take)

    def _poll_connection(self, key: str) -> Any:
        """This thread's connection for blocking pops on ``key``'s node (made at its first pop
        there; closed when the thread ends and its thread-local goes, or when a pop fails)."""
        connections = getattr(self._poller, "connections", None)
        if connections is None:
            connections = self._poller.connections = {}
        name, pool = self._node_pool(key)
        connection = connections.get(name)
        if connection is None:
            connection = connections[name] = pool.connection_class(
                **{**pool.connection_kwargs, "socket_timeout": self._poll_timeout_s})
            with self._lock:
                self._poll_connections.add(connection)
        return connection

    def _node_pool(self, key: str) -> tuple[str, Any]:
        """The name and connection pool of the node owning ``key`` ("" on one server)."""
        if self._cluster is None:
            return "", cast("redis.Redis", self.client).connection_pool
        node = self._cluster.get_node_from_key(key)
        return node.name, node.redis_connection.connection_pool

    def _refresh_slots(self) -> None:
        """(Cluster) Re-read the slot map: a pop's node failed or its slot moved."""
        if self._cluster is not None:
            with contextlib.suppress(redis.RedisError):
                self._cluster.nodes_manager.initialize()

    def interrupt_pops(self) -> None:
        with self._lock:
            polling = list(self._poll_connections)
        for connection in polling:  # a poller blocked in a pop ends now, not after its wait
            _cut(connection)

    def close(self) -> None:
        """Give the batcher's held connection back, close the answer-list waits' connections
        (after the node's threads ended)."""
        self.batch.close()
        with self._lock:
            idle = [c for connections in self._idle_waiters.values() for c in connections]
        for connection in idle:
            connection.disconnect()
