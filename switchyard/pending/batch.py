"""Concurrent script calls of one node share a round trip (flat combining).

Part of the Redis adapter (``store.py`` is its only user). Why: with redis-py a round trip costs
~150 us of Python CPU, more than the Lua work it carries; under load a node's callers and pollers
each paid it for every enqueue, take and respond. Here a thread that finds no round trip under way
runs its own call at once (a lone call is not delayed and runs exactly as before); threads
arriving meanwhile queue theirs, and the next of them sends everything queued as one pipeline.
Each script is idempotent (see ``lua/``), so redis-py's retry of a whole pipeline after a lost
connection is as safe as the retry of one call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError, SlotNotCoveredError
from redis.utils import HIREDIS_AVAILABLE

from switchyard.core.redis_client import RedisClient
from switchyard.pending.wakeup import Signal

_UNSET = object()

_pack_command: Callable[[tuple[Any, ...]], bytes] | None = None
if HIREDIS_AVAILABLE:  # (without it: redis-py's pure-Python parser, the benchmark's A/B)
    from hiredis import pack_command as _pack_command


def packed(connection: Any, *commands: tuple[Any, ...]) -> list[bytes]:
    """``commands`` packed for ``connection``, to go in one write: by hiredis straight (redis-py's
    packer first checks and copies every argument, two thirds of its cost), else by redis-py."""
    if _pack_command is None:
        return cast("list[bytes]", connection.pack_commands(commands))
    return [b"".join([_pack_command(command) for command in commands])]

# A cluster's answers that mean "ask again where the slot map now says" (a failover, a resharding)
MOVED = (redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.TryAgainError,
         redis.exceptions.ClusterDownError)


class _Op:
    __slots__ = ("args", "done", "error", "keys", "result", "script", "wake")

    def __init__(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
        self.script, self.keys, self.args = script, keys, args
        self.done = False
        self.result: Any = _UNSET
        self.error: BaseException | None = None
        self.wake = Signal()


class ScriptBatcher:
    """Run registered scripts, combining the calls of concurrent threads into one pipeline."""

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self._cluster = client if isinstance(client, RedisCluster) else None  # (a costly isinstance)
        # Lone calls go out on a connection held for good (only the thread sending a round trip
        # uses it), one per node of a cluster (the node owning the first key's slot), packed
        # and read straight on the connection: a third of the Python a call through the
        # client's command layer costs (pool, retry wrapper, response callbacks), paid twice on
        # every fast call's path. Made at the first call: a node is built without connecting.
        self._held: dict[str, tuple[Any, Any]] = {}  # node name -> (its pool, the held connection)
        self._mutex = threading.Lock()  # guards the queue
        self._leader = threading.Lock()  # held by the thread sending a round trip
        self._queue: list[_Op] = []
        self.round_trips = 0  # how many round trips the calls took (the benchmark reports it)
        self.calls = 0

    def call(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """The script's reply; raises what redis-py raised (after its own retries)."""
        op = _Op(script, keys, args)
        with self._mutex:
            self._queue.append(op)
        while not op.done:
            if self._leader.acquire(blocking=False):
                try:
                    with self._mutex:
                        batch, self._queue = self._queue, []
                    if batch:
                        self._run(batch)
                finally:
                    self._leader.release()
                # Calls queued while this round trip ran: wake the first, it sends them all.
                with self._mutex:
                    head = self._queue[0] if self._queue else None
                if head is not None:
                    head.wake.set()
            else:
                op.wake.wait()  # ``done`` is set before ``wake``: the loop test then sees it
        if op.error is not None:
            raise op.error
        return op.result

    def close(self) -> None:
        """Give the held connections back to their pools (unless a round trip still runs)."""
        if self._leader.acquire(timeout=1.0):
            try:
                held, self._held = self._held, {}
                for pool, connection in held.values():
                    pool.release(connection)
            finally:
                self._leader.release()

    def _routed(self, keys: Sequence[Any]) -> dict[str, Any]:
        """On a cluster, the node of the first key's slot (the slot map's), for a pipelined call:
        redis-py's cluster pipeline would otherwise ask a server for an EVALSHA's keys (``COMMAND
        GETKEYS``: 1 to 2 more round trips per call, by bench/cluster_bench.py). A MOVED is
        followed as for any command (its retry routes by key)."""
        if self._cluster is None:
            return {}
        return {"target_nodes": self._cluster.get_node_from_key(keys[0])}

    def _connection(self, keys: Sequence[Any]) -> Any:
        """The held connection to the node of ``keys`` (None: a cluster call with no key)."""
        if self._cluster is not None:
            if not keys:
                return None
            node = self._cluster.get_node_from_key(keys[0])
            name, pool = node.name, node.redis_connection.connection_pool
        else:
            name, pool = "", cast("redis.Redis", self.client).connection_pool
        held = self._held.get(name)
        if held is None:
            held = self._held[name] = (pool, pool.get_connection())
        return held[1]

    def _lone(self, op: _Op) -> Any:
        """One attempt straight on the held connection; anything out of the ordinary (a lost
        connection, an unloaded script, a moved slot) goes the client's own way after it, with
        its retries, reloading and redirections (every script is idempotent)."""
        connection = None
        try:
            connection = self._connection(op.keys)
            if connection is not None:
                connection.send_packed_command(packed(
                    connection, ("EVALSHA", op.script.sha, len(op.keys), *op.keys, *op.args)))
                return connection.read_response()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            if connection is not None:
                connection.disconnect()  # (the next call connects it again)
        except (NoScriptError, SlotNotCoveredError, *MOVED):
            pass
        return op.script(keys=op.keys, args=op.args, client=self.client)

    def _run(self, batch: list[_Op]) -> None:
        self.round_trips += 1
        self.calls += len(batch)
        try:
            if len(batch) == 1:
                batch[0].result = self._lone(batch[0])
            else:
                with self.client.pipeline(transaction=False) as pipe:
                    for op in batch:
                        pipe.execute_command("EVALSHA", op.script.sha, len(op.keys), *op.keys, *op.args,
                                             **self._routed(op.keys))
                    replies = pipe.execute(raise_on_error=False)
                for op, reply in zip(batch, replies, strict=True):
                    if isinstance(reply, redis.exceptions.NoScriptError):
                        try:  # Redis restarted: Script loads itself and runs again
                            reply = op.script(keys=op.keys, args=op.args)
                        except Exception as exc:  # handed to the op's own thread
                            reply = exc
                    if isinstance(reply, Exception):
                        op.error = reply
                    else:
                        op.result = reply
        except Exception as exc:  # every op of the round trip fails with it
            for op in batch:
                if op.result is _UNSET and op.error is None:
                    op.error = exc
        finally:
            for op in batch:
                if op.result is _UNSET and op.error is None:
                    op.error = RuntimeError("the round trip carrying this call was interrupted")
                op.done = True
                op.wake.set()
