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
from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script

from switchyard.core.redis_client import RedisClient
from switchyard.pending.wakeup import Signal

_UNSET = object()


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
        # Lone calls go through a connection of their own, held for good (only the thread
        # sending a round trip uses it): ~40% less redis-py CPU than taking one from the pool
        # and giving it back for every command. Same pool, so the same retry and timeouts.
        # Made at the first call: a node is built without connecting, as before. (A cluster
        # client has a pool per node: lone calls go through it, routed by their key's slot.)
        self._direct: RedisClient | None = None
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
        """Give the held connection back to the pool (unless a round trip still runs on it)."""
        if self._leader.acquire(timeout=1.0):
            try:
                if self._direct is not None and self._direct is not self.client:
                    self._direct.close()
                    self._direct = None
            finally:
                self._leader.release()

    def _routed(self, keys: Sequence[Any]) -> dict[str, Any]:
        """On a cluster, the node of the first key's slot (the slot map's), for a pipelined call:
        redis-py's cluster pipeline would otherwise ask a server for an EVALSHA's keys (``COMMAND
        GETKEYS``: 1 to 2 more round trips per call, by bench/cluster_bench.py). A MOVED is
        followed as for any command (its retry routes by key)."""
        if not isinstance(self.client, redis.cluster.RedisCluster):
            return {}
        return {"target_nodes": self.client.get_node_from_key(keys[0])}

    def _run(self, batch: list[_Op]) -> None:
        self.round_trips += 1
        self.calls += len(batch)
        try:
            if len(batch) == 1:
                op = batch[0]
                if self._direct is None:
                    client = self.client
                    self._direct = client if isinstance(client, redis.cluster.RedisCluster) else \
                        redis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
                op.result = op.script(keys=op.keys, args=op.args, client=self._direct)
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
