"""The Redis adapter's watcher, node-API and admin operations (``RedisStore`` inherits them; part
of the adapter with ``store.py``): the data-loss guards, the long polls' count, the status scan."""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, cast

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from switchyard.core.redis_client import RedisClient
from switchyard.pending.batch import MOVED
from switchyard.pending.errors import PendingError, StoreUnavailableError
from switchyard.pending.settings import PendingSettings, check_endpoint


def _ms(seconds: float) -> int:  # (store.py imports it)
    return max(1, int(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class AdminOps(ABC):
    """What ``RedisStore`` does for the watcher, the node API and ``status``; it provides the two
    abstract methods below."""

    settings: PendingSettings
    client: RedisClient
    guard_key: str
    _cluster: RedisCluster | None
    _guards: tuple[Any, dict[str, tuple[int, int]]]

    @abstractmethod
    def _available(self, operation: Callable[[], Any]) -> Any:
        """Run ``operation``, retrying an unreachable Redis for the retry window."""

    @abstractmethod
    def polls_key(self, endpoint: str) -> str:
        """The key counting ``endpoint``'s long polls."""

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
            except redis.RedisError as exc:  # refused (out of memory...)
                raise PendingError(f"Redis refused the data-loss guard: {exc}") from exc
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
        return cast("dict[str, Any]", self._available(self._status))

    def _status(self) -> dict[str, Any]:
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
