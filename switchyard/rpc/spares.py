"""Warm spare workers' registry in Redis: spares that wait for a key, and their assignments.

A spare is a worker process started ahead of time, its handler imported and its broker
connection open, bound to no key. Once ready it *registers* (``SADD`` to the pool's set); a control
plane starting a group for a new key *claims* one (claim_spare.lua: ``SREM`` then ``RPUSH`` of the
key onto the spare's own list, in one script), and the spare, blocked on that list (``BLPOP``),
starts consuming the key's queue. Whoever removes a spare from the set owns it, so two control
planes never hand out one spare, and a spare that *withdraws* (``SREM``: stopping) cannot be
claimed after. A spare that dies while registered stays in the set until its driver forgets it
(``forget``); a claim of it is the same as a claim of a spare killed while adopting: its group has
no live worker, and the reconciler starts the group as it would any other. A waiting spare
*rejoins* between its waits (register_spare.lua: back into the set unless a key is on its list), so
a Redis that lost the set (flushed, failed over) gets its spares back within a wait's turn.

Redis layout (under the pool's prefix and hash tag, ``switchyard:rpc:{<pool>}:``, so the script's two
keys share a slot on a Redis Cluster):

- ``spares``              set of the worker ids of the spares waiting
- ``spare:<worker id>``   list: the key handed to that spare (at most one)
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from switchyard.rpc import protocol

if TYPE_CHECKING:  # a worker that is no spare reads SPARE_ENV from here without importing redis
    from switchyard.core.redis_client import RedisClient

SPARE_ENV = "WORKER_SPARE"  # the worker protocol's switch: "1" starts the worker as a spare


class SpareRegistry:
    """One pool's spares (both sides: the spare's and the control plane's). Thread-safe."""

    def __init__(self, client: RedisClient, pool: str) -> None:
        self.pool = protocol.validate_pool(pool)
        self.redis = client
        self.prefix = f"switchyard:rpc:{{{self.pool}}}:"
        self._set = self.prefix + "spares"
        lua = resources.files("switchyard.rpc.lua")
        self._claim = client.register_script(lua.joinpath("claim_spare.lua").read_text())
        self._rejoin = client.register_script(lua.joinpath("register_spare.lua").read_text())

    def _list(self, worker_id: str) -> str:
        return f"{self.prefix}spare:{worker_id}"

    # -- the spare's side ---------------------------------------------------------------------
    def register(self, worker_id: str) -> None:
        """Ready: handler imported, connection open (a key handed out before this would wait)."""
        self.redis.delete(self._list(worker_id))
        self.redis.sadd(self._set, worker_id)

    def rejoin(self, worker_id: str) -> bool:
        """Still waiting: back into the set if it was lost (a Redis flush or failover), never after a
        claim (register_spare.lua); whether it is in the set."""
        return bool(self._rejoin(keys=[self._set, self._list(worker_id)], args=[worker_id]))

    def wait(self, worker_id: str, timeout_s: float) -> str | None:
        """The key handed to this spare, or None after ``timeout_s`` (the caller's turn for I/O)."""
        popped = self.redis.blpop([self._list(worker_id)], timeout=timeout_s)
        if popped is None:
            return None
        raw = popped[1]
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def withdraw(self, worker_id: str) -> str | None:
        """Stop waiting: None if this spare was still unclaimed (now it cannot be), else the key
        a claim handed it meanwhile (the caller must serve it or die trying)."""
        if self.redis.srem(self._set, worker_id):
            return None
        raw = self.redis.lpop(self._list(worker_id))
        return raw.decode() if isinstance(raw, bytes) else (str(raw) if raw is not None else None)

    # -- the control plane's side ---------------------------------------------------------------
    def claim(self, worker_id: str, key: str) -> bool:
        """Hand ``key`` to spare ``worker_id``; False if it was not waiting (claimed, withdrawn,
        or not ready yet)."""
        return bool(self._claim(keys=[self._set, self._list(worker_id)], args=[worker_id, key]))

    def claim_any(self, key: str, attempts: int = 8) -> str | None:
        """Hand ``key`` to any waiting spare of the pool; its worker id, or None when none is left."""
        for _ in range(attempts):
            candidate = self.redis.srandmember(self._set)
            if candidate is None:
                return None
            worker_id = candidate.decode() if isinstance(candidate, bytes) else str(candidate)
            if self.claim(worker_id, key):
                return worker_id
        return None

    def waiting(self) -> set[str]:
        """The worker ids of the spares waiting (``switchyard status``)."""
        return {m.decode() if isinstance(m, bytes) else str(m) for m in self.redis.smembers(self._set)}

    def is_waiting(self, worker_id: str) -> bool:
        return bool(self.redis.sismember(self._set, worker_id))

    def forget(self, worker_id: str) -> None:
        """A spare that died: out of the set, its list dropped."""
        self.redis.srem(self._set, worker_id)
        self.redis.delete(self._list(worker_id))
