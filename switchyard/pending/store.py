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
from importlib import resources
from typing import Any, cast

import redis
from redis.backoff import ConstantBackoff
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.retry import Retry

from switchyard.core.redis_client import RedisClient, open_redis
from switchyard.pending.batch import MOVED, ScriptBatcher, packed
from switchyard.pending.errors import PendingError, StoreUnavailableError
from switchyard.pending.ports import CallerBeatReply, ProcessorBeatReply, WithdrawReply
from switchyard.pending.settings import PendingSettings, check_endpoint
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


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisStore:
    """One node's pending-queue state in Redis; ``closed`` is the node's (set when it closes)."""

    refused: tuple[type[Exception], ...] = (redis.RedisError,)

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
                    raise
                now = time.monotonic()
                give_up = give_up or now + (0 if self._cluster is None else self.settings.retry_window_s)
                if now >= give_up or self._closed.is_set():
                    raise StoreUnavailableError(f"Redis unreachable after retrying: {exc}") from exc
                self._closed.wait(self.settings.retry_interval_s)

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
             _ms(s.pending_list_ttl_s)]))

    def caller_beat(self, endpoint: str, request_id: str, element: bytes) -> CallerBeatReply:
        s = self.settings
        reply = self._available(lambda: self._heartbeat(
            keys=[self.state_key(endpoint, request_id), self.pending_key(endpoint)],
            args=["c", "", _ms(s.in_flight_ttl_s), element, _ms(s.processor_timeout_s),
                  _ms(s.pending_list_ttl_s)]))
        state = _text(reply[0])
        if state == "missing":
            return CallerBeatReply(state, 0, b"")
        return CallerBeatReply(state, int(reply[1]), reply[2])

    def withdraw(self, endpoint: str, request_id: str, element: bytes, mode: str) -> WithdrawReply:
        reply = self._available(lambda: self._withdraw(
            keys=[self.state_key(endpoint, request_id), self.pending_key(endpoint)],
            args=[request_id, mode, self.node_channel_prefix, element, self.endpoint_channel(endpoint)]))
        return WithdrawReply(_text(reply[0]), reply[1] if len(reply) > 1 else None)

    def unlink_answered(self, answered: Mapping[str, Sequence[str]]) -> None:
        """One UNLINK per endpoint (its keys share one cluster slot), all in one round trip."""
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for endpoint, request_ids in answered.items():
                    # (execute_command: a cluster pipeline's unlink() splits keys by slot, not queued)
                    pipe.execute_command("UNLINK", *(self.state_key(endpoint, r) for r in request_ids))
                pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError):
            logger.warning("could not unlink %d answered states; their TTL will",
                           sum(map(len, answered.values())))

    # ------------------------------------------------------- processing side

    def respond(self, endpoint: str, request_id: str, take_id: str, raw: bytes) -> str:
        s = self.settings
        return _text(self._available(lambda: self.batch.call(
            self._respond, [self.state_key(endpoint, request_id), self.take_key(endpoint, take_id)],
            [take_id, raw, _ms(s.response_ttl_s), self.node_channel_prefix, _ms(s.sender_timeout_s),
             request_id, self.node_id, self._take_ttl_ms])))

    def processor_beat(self, endpoint: str, request_id: str, take_id: str) -> ProcessorBeatReply:
        reply = self._available(lambda: self._heartbeat(
            keys=[self.state_key(endpoint, request_id), self.take_key(endpoint, take_id)],
            args=["p", take_id, _ms(self.settings.in_flight_ttl_s), request_id, self.node_id,
                  self._take_ttl_ms]))
        state = _text(reply[0])
        if state in ("missing", "not_taker"):
            return ProcessorBeatReply(state, 0, False)
        return ProcessorBeatReply(state, int(reply[1]), bool(int(reply[2])))

    def pop(self, endpoint: str, take_id: str, deadline: float) -> bytes | None:
        """Move the next request of ``endpoint`` into the take key (blocking until ``deadline``).

        BLMOVE and the take key's PEXPIRE go in one write: Redis runs the PEXPIRE right after the
        move, so the moved request is never in a key without a TTL. Retried here for the retry
        window, not by redis-py: after a lost connection the take key is read first, since a pop
        whose reply was lost may have moved a request into it.
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
                connection.send_packed_command(packed(connection, pop, ("PEXPIRE", take, ttl)))
                element = self._read_pop(connection, endpoint)
                if element is not None or deadline - time.monotonic() <= 0:
                    return element
            except (redis.ConnectionError, redis.TimeoutError, OSError, *MOVED) as exc:
                connection.disconnect()
                self._refresh_slots()
                if self._closed.is_set():  # the node's close interrupted the pop: it may have moved one
                    self._give_back_popped(pending, take)
                    return None
                now = time.monotonic()
                give_up = give_up or now + s.retry_window_s
                if now >= give_up:
                    raise StoreUnavailableError(f"Redis unreachable after retrying: {exc}") from exc
                lost = True
                self._closed.wait(s.retry_interval_s)

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
        if self._cluster is None:
            name, pool = "", cast("redis.Redis", self.client).connection_pool
        else:
            node = self._cluster.get_node_from_key(key)
            name, pool = node.name, node.redis_connection.connection_pool
        connection = connections.get(name)
        if connection is None:
            connection = connections[name] = pool.connection_class(
                **{**pool.connection_kwargs, "socket_timeout": self._poll_timeout_s})
            with self._lock:
                self._poll_connections.add(connection)
        return connection

    def _refresh_slots(self) -> None:
        """(Cluster) Re-read the slot map: a pop's node failed or its slot moved."""
        if self._cluster is not None:
            with contextlib.suppress(redis.RedisError):
                self._cluster.nodes_manager.initialize()

    def interrupt_pops(self) -> None:
        with self._lock:
            polling = list(self._poll_connections)
        for connection in polling:  # a poller blocked in a pop ends now, not after its wait
            sock = connection._sock  # redis-py has no public way to interrupt a blocked read
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # the poller's own thread then disconnects

    # ------------------------------------------------------------- watcher

    def swap_guards(self, token: str, ttl_s: float) -> dict[str, bytes | None]:
        """Swap ``token`` into every guard (one per shard on a cluster); a shard that does not
        answer is left out (checked next time), unless none does."""
        replies: dict[str, bytes | None] = {}
        failure: Exception | None = None
        for key in self.guard_keys():
            try:
                replies[key] = cast("bytes | None", self.client.set(key, token, px=_ms(ttl_s), get=True))
            except (redis.ConnectionError, redis.TimeoutError, *MOVED) as exc:
                failure = exc
        if not replies and failure is not None:
            raise StoreUnavailableError(f"Redis unreachable after retrying: {failure}") from failure
        return replies

    def guard_keys(self) -> dict[str, tuple[int, int]]:
        """The data-loss guard keys: one on a single server; on a cluster one per shard's slot
        range, tagged into it (a master that lost its data loses its guard). Recomputed when the
        slot map changes; a failover keeps the slots, so the same keys."""
        if self._cluster is None:
            return {self.guard_key: (0, 16383)}
        slots_cache = self._cluster.nodes_manager.slots_cache
        cached, keys = self._guards
        if cached is not slots_cache:
            keys = {}
            ranges: list[list[Any]] = []
            for slot in range(16384):
                nodes = slots_cache.get(slot)
                owner = nodes[0].name if nodes else None
                if ranges and ranges[-1][2] == owner and ranges[-1][1] == slot - 1:
                    ranges[-1][1] = slot
                else:
                    ranges.append([slot, slot, owner])
            for low, high, owner in ranges:
                if owner is not None:
                    tag = next(t for t in (f"{low}.{i}" for i in range(1 << 20))
                               if low <= key_slot(t.encode()) <= high)
                    keys[f"{self.guard_key}:{{{tag}}}"] = (low, high)
            self._guards = (slots_cache, keys)
        return keys

    def endpoint_in(self, endpoint: str, slots: tuple[int, int]) -> bool:
        """Whether ``endpoint``'s keys live in the slot range ``slots``."""
        low, high = slots
        return low <= key_slot(check_endpoint(endpoint).encode()) <= high

    # ------------------------------------------------------------ node API

    def take_poll_slot(self, endpoint: str, slot: str, lapses_at: float, key_ttl_ms: int, limit: int) -> bool:
        key, now = self.polls_key(endpoint), time.time()

        def count() -> int:
            pipe = self.client.pipeline(transaction=True)
            pipe.zremrangebyscore(key, "-inf", now)
            pipe.zadd(key, {slot: lapses_at})
            pipe.zcard(key)
            pipe.pexpire(key, key_ttl_ms)
            return int(pipe.execute()[2])

        try:
            if self._available(count) <= limit:
                return True
            self.client.zrem(key, slot)
            return False
        except (redis.RedisError, StoreUnavailableError) as exc:
            raise StoreUnavailableError(f"Redis unavailable for the poll count: {exc}") from exc

    def give_back_poll_slot(self, endpoint: str, slot: str) -> None:
        with contextlib.suppress(redis.RedisError):  # else it lapses by itself
            self.client.zrem(self.polls_key(endpoint), slot)

    # --------------------------------------------------------------- admin

    def status(self) -> dict[str, Any]:
        """Queue depth, in-flight requests by state and oldest age, per endpoint (SCAN: an admin view)."""
        now_ms = int(self._available(self.client.time)[0]) * 1000
        prefix = f"{self.settings.prefix}:{{"
        endpoints: dict[str, dict[str, Any]] = {}

        def entry(endpoint: str) -> dict[str, Any]:
            return endpoints.setdefault(endpoint, {"waiting": 0, "queued": 0, "taken": 0, "answered": 0,
                                                   "oldest_age_s": 0.0})

        for key in self._scan(f"{prefix}*}}:r:*"):
            text = _text(key)
            endpoint = text[len(prefix):text.rindex("}:r:")]
            state, at = self.client.hmget(key, "s", "at")
            if state is None:
                continue
            item = entry(endpoint)
            item[{"q": "queued", "t": "taken", "a": "answered"}[_text(state)]] += 1
            # "at" is written with "s" (in one HSET), so it is there when the state is.
            item["oldest_age_s"] = max(item["oldest_age_s"], (now_ms - int(cast("bytes", at))) / 1000)
        for key in self._scan(f"{prefix}*}}:pending"):
            text = _text(key)
            entry(text[len(prefix):text.rindex("}:pending")])["waiting"] = self.client.llen(key)
        return dict(sorted(endpoints.items()))

    def _scan(self, pattern: str) -> list[Any]:
        """Every key matching ``pattern`` (on a cluster: SCAN on every master)."""
        keys = self._available(lambda: list(self.client.scan_iter(match=pattern, count=1000)))
        return cast("list[Any]", keys)

    def close(self) -> None:
        """Give the batcher's held connection back (after the node's threads ended)."""
        self.batch.close()
