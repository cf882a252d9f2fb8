"""The event bus's state in Redis: tokens, topics, subscribers, queued events (one stream per
subscriber) and the job queues. Every change that touches more than one key is one Lua script
(``switchyard/bus/lua/``, whose ``_prelude.lua`` documents the key layout).

Where Routemaster batched events into separate ``batch:<uid>`` lists delivered by independent
jobs (so two batches of one subscriber could be delivered at once, or out of order after a retry),
here a subscriber's events wait in one stream in acceptance order and ONE job per subscriber
delivers them: the next batch is the head of the stream, removed only after the subscriber's 2xx.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
from collections.abc import Callable
from importlib import resources
from typing import Any, TypeVar, overload

import redis

from switchyard.bus.errors import (
    StoreError,
    StoreUnavailableError,
    TopicClaimedError,
    TopicLimitError,
    UnknownJobError,
    UnknownTokenError,
)
from switchyard.bus.ports import Batch, QueueLengths, Subscriber
from switchyard.bus.settings import BusSettings
from switchyard.core.errors import InvalidNameError
from switchyard.core.redis_client import RedisClient, is_cluster, used_memory

NAME_RE = re.compile(r"[a-z0-9:_-]{1,64}")  # client names and tokens (Routemaster's User), fullmatch
DELIVER = "deliver:"  # delivery jobs are "deliver:<subscriber token>"
QUEUES = ("main", "aux")  # main: deliveries; aux: housekeeping (autodrop, monitor, scrub)
DEFAULT_MAX_EVENTS = 100
DEFAULT_TIMEOUT_MS = 500
MAX_HEALTH = 100


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _wrapped(method: _Method) -> _Method:
    """Redis's errors as the bus's, ``from`` the driver's: unreachable (connection, timeout), or
    refused (a script error, OOM, WRONGTYPE)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailableError(f"Redis unavailable: {exc}") from exc
        except redis.RedisError as exc:
            raise StoreError(f"Redis refused: {exc}") from exc

    return call  # type: ignore[return-value]


@functools.cache
def _script_source(name: str) -> str:
    folder = resources.files("switchyard.bus.lua")
    return folder.joinpath("_prelude.lua").read_text() + folder.joinpath(name).read_text()


@overload
def as_text(value: bytes | str) -> str: ...
@overload
def as_text(value: bytes | str | None) -> str | None: ...
def as_text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class BusStore:
    """The ``BusStorePort`` on Redis: typed access to one bus's keys (``settings.key_prefix``) on one
    Redis client, every failure a ``StoreError``."""

    def __init__(self, client: RedisClient, settings: BusSettings) -> None:
        self.redis = client
        self.settings = settings
        self.prefix = p = settings.key_prefix
        self.tokens_key, self.topics_key = p + "tokens", p + "topics"
        self.topic_events_key, self.subscribers_key = p + "topic_events", p + "subscribers"
        self.workers_key, self.counters_key = p + "workers", p + "counters"
        self._scripts: dict[str, Any] = {}

    def script(self, name: str) -> Any:
        """The registered script ``lua/<name>.lua`` (EVALSHA, loaded again after a Redis restart)."""
        if name not in self._scripts:
            self._scripts[name] = self.redis.register_script(_script_source(f"{name}.lua"))
        return self._scripts[name]

    @_wrapped
    def run_script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """``lua/<name>.lua`` by one EVALSHA (redis-py's Script wrapper costs ~0.03 ms more of the
        ~0.2 ms a publish takes in the client); on NOSCRIPT (a restarted or flushed Redis) the
        wrapper loads it."""
        script = self.script(name)
        try:
            return self.redis.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return script(keys=keys, args=args)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def stream_key(self, token: str) -> str:
        return self.key("events", token)

    # -- tokens -------------------------------------------------------------------------------

    @_wrapped
    def tokens(self) -> dict[str, str]:
        """Token -> client name."""
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(self.tokens_key).items()}

    @_wrapped
    def token_exists(self, token: str) -> bool:
        return bool(self.redis.hexists(self.tokens_key, token))

    @_wrapped
    def token_name(self, token: str) -> str | None:
        return as_text(self.redis.hget(self.tokens_key, token))

    @_wrapped
    def create_token(self, name: str, token: str | None = None) -> str:
        """Register a client; the default token is ``<name>--<32 hex>`` as in Routemaster."""
        token = token or f"{name}--{secrets.token_hex(16)}"
        if not NAME_RE.fullmatch(name) or not NAME_RE.fullmatch(token):
            raise InvalidNameError("names and tokens must match [a-z0-9:_-]{1,64}")
        self.redis.hset(self.tokens_key, token, name)
        return token

    @_wrapped
    def delete_token(self, token: str) -> None:
        """Revoke a token and remove its subscriber (subscriptions, queued events, delivery job) in
        one step, as Routemaster did: a revoked client receives nothing more."""
        self.run_script("delete_subscriber", [self.subscribers_key], [self.prefix, token, "1"])

    # -- topics -------------------------------------------------------------------------------

    @_wrapped
    def publish(self, topic: str, publisher: str, event_json: str) -> int:
        """Queue one event for every subscriber of ``topic`` (the publisher's token is checked in the
        same script); returns how many subscribers it reached."""
        ok, detail = self.run_script("ingest", [self.topics_key, self.topic_events_key, self.tokens_key],
                                     [self.prefix, topic, publisher, event_json])
        if ok < 0:
            raise UnknownTokenError("unknown token")
        if not ok:
            raise TopicClaimedError("topic claimed by another client")  # whose token: never said
        return int(detail)

    @_wrapped
    def topics(self) -> list[dict[str, Any]]:
        owners = self.redis.hgetall(self.topics_key)
        counts = self.redis.hgetall(self.topic_events_key)
        return [{"name": as_text(name), "publisher": as_text(owner) or None,
                 "events": int(counts.get(name, 0))} for name, owner in sorted(owners.items())]

    @_wrapped
    def delete_topic(self, topic: str, caller: str | None) -> int:
        """1 deleted, 0 no such topic, -1 the caller (a client token; None = root) does not own it
        (an unclaimed topic is the creator's: the client whose subscription created it)."""
        return int(self.run_script("delete_topic", [self.topics_key, self.topic_events_key],
                                   [self.prefix, topic, caller or ""]))

    # -- subscribers --------------------------------------------------------------------------

    @_wrapped
    def subscribe(self, token: str, topics: list[str], callback: str, uuid: str,
                  max_events: int | None, timeout_ms: int | None, *, registered: bool = False) -> None:
        """Make the token's subscription exactly this. ``registered`` (the API): the token must be
        registered, in the same step (UnknownTokenError: revoked since the API checked it).
        TopicLimitError: too many new unclaimed topics. Either way nothing was written."""
        limit = self.settings.max_unclaimed_topics
        done = int(self.run_script(
            "subscribe", [self.subscribers_key, self.topics_key],
            [self.prefix, token, callback, uuid, "" if max_events is None else max_events,
             "" if timeout_ms is None else timeout_ms, limit, "1" if registered else "",
             *dict.fromkeys(topics)]))
        if done == -1:
            raise UnknownTokenError("unknown token")
        if done == -2:
            raise TopicLimitError(limit)

    @_wrapped
    def unclaimed_created(self, token: str) -> int:
        """Unclaimed topics the token's subscriptions created (what its bound counts)."""
        return int(self.redis.scard(self.key("created", token)))

    @_wrapped
    def drop_unclaimed_topics(self, batch: int = 500) -> int:
        """Remove the unclaimed topics without subscribers older than the setting's age; returns
        how many. Unclaimed topics from before the index (no creation time) are indexed now."""
        index = self.key("unclaimed")
        now = self.now_ms()
        pipe = self.redis.pipeline(transaction=False)
        for topic, owner in self.redis.hscan_iter(self.topics_key, count=1000):
            if not owner:
                pipe.zadd(index, {topic: now}, nx=True)
        pipe.execute()
        dropped = 0
        while True:
            removed, seen = self.run_script("drop_unclaimed", [self.topics_key, self.topic_events_key],
                                            [self.prefix, self.settings.unclaimed_topic_ttl_ms, batch])
            dropped += int(removed)
            if int(seen) < batch:
                return dropped

    @_wrapped
    def unsubscribe(self, token: str, topic: str) -> int:
        """1 done, -1 no such subscriber, -2 no such topic, -3 not subscribed."""
        return int(self.run_script("unsubscribe", [self.subscribers_key, self.topics_key],
                                   [self.prefix, token, topic]))

    @_wrapped
    def delete_subscriber(self, token: str) -> bool:
        return bool(self.run_script("delete_subscriber", [self.subscribers_key], [self.prefix, token]))

    @_wrapped
    def subscriber_tokens(self) -> list[str]:
        return sorted(as_text(t) for t in self.redis.smembers(self.subscribers_key))

    @_wrapped
    def subscriber(self, token: str, with_topics: bool = False) -> Subscriber | None:
        raw = {as_text(k): as_text(v) for k, v in self.redis.hgetall(self.key("sub", token)).items()}
        if "callback" not in raw:
            return None
        topics = tuple(sorted(as_text(t) for t in self.redis.smembers(self.key("subtopics", token)))) \
            if with_topics else ()
        return Subscriber(token=token, callback=raw["callback"], uuid=raw.get("uuid", ""),
                          max_events=int(raw.get("max", DEFAULT_MAX_EVENTS)),
                          timeout_ms=int(raw.get("timeout", DEFAULT_TIMEOUT_MS)),
                          health_points=int(raw.get("hp", MAX_HEALTH)),
                          backoff_until_ms=int(raw.get("until", 0)), topics=topics)

    @_wrapped
    def queued(self, token: str) -> tuple[int, int | None]:
        """(events queued for the subscriber, acceptance time of the oldest in ms or None)."""
        stream = self.stream_key(token)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(stream)
        pipe.xrange(stream, count=1)
        length, head = pipe.execute()
        oldest = int(as_text(head[0][0]).split("-")[0]) if head else None
        return int(length), oldest

    @_wrapped
    def counters(self) -> dict[str, int]:
        return {as_text(k): int(v) for k, v in self.redis.hgetall(self.counters_key).items()}

    @_wrapped
    def now_ms(self) -> int:
        """Redis's clock, the one every stored time uses: on a cluster the clock of the node that
        holds the bus (its scripts' TIME), not of whichever node a keyless command reaches."""
        if is_cluster(self.redis):
            node = self.redis.get_node_from_key(self.tokens_key)
            seconds, micros = self.redis.time(target_nodes=node)
        else:
            seconds, micros = self.redis.time()
        return seconds * 1000 + micros // 1000

    @_wrapped
    def ping(self) -> None:
        self.redis.ping()

    @_wrapped
    def used_memory(self) -> int:
        """What autodrop weighs against ``max_mem``: on a cluster, summed over every master."""
        return used_memory(self.redis)

    @_wrapped
    def autodrop_batch(self) -> tuple[str, int] | None:
        """Drop the oldest batch of the bus (counted per subscriber); (its subscriber, its events),
        or None when nothing is queued."""
        dropped = self.run_script("autodrop", [self.subscribers_key, self.counters_key], [self.prefix])
        return (as_text(dropped[0]), int(dropped[1])) if dropped else None

    # -- delivery -----------------------------------------------------------------------------

    @_wrapped
    def begin_delivery(self, token: str) -> Batch | None:
        """The subscriber's next batch (at most ``max`` events, oldest first); None: no subscriber."""
        begun = self.run_script("begin_delivery", [self.key("sub", token), self.stream_key(token)], [])
        if begun is None:
            return None
        callback, uuid, health, backoff_until, now, entries = begun
        return Batch(callback=as_text(callback), uuid=as_text(uuid), health_points=int(health),
                     backoff_until_ms=int(backoff_until), now_ms=int(now),
                     entries=[(as_text(entry_id), fields[1]) for entry_id, fields in entries])

    @_wrapped
    def finish_delivery(self, pending_key: str, job: str, outcome: str, last_id: str = "") -> int:
        """Settle a delivery job (``ok`` removes the batch up to ``last_id``); the health points after."""
        s = self.settings
        return int(self.run_script("finish_delivery", [pending_key],
                                   [self.prefix, job, outcome, last_id, s.heal_rate, s.damage_rate,
                                    s.max_backoff_ms]))

    # -- jobs ---------------------------------------------------------------------------------

    def _queue_key(self, state: str, queue: str) -> str:
        if queue not in QUEUES:
            raise UnknownJobError(f"unknown queue {queue!r}")
        return self.key("jobs", state, queue)

    def pending_key(self, queue: str, worker_id: str) -> str:
        return self.key("jobs", "pending", queue, worker_id)

    @_wrapped
    def push_job(self, queue: str, job: str, delay_ms: int = 0) -> int:
        """Queue ``job`` to run in ``delay_ms``; a duplicate is a no-op.
        Returns 1 queued, 2 an already scheduled copy brought forward, 0 left alone."""
        return int(self.run_script("push", [self._queue_key("index", queue)],
                                   [self.prefix, queue, job, max(0, delay_ms)]))

    @_wrapped
    def acquire_job(self, queue: str, worker_id: str, timeout_s: float) -> str | None:
        """The worker's job: one it still holds (a Redis error interrupted it), else the next instant
        one, moved atomically into its pending list; None after ``timeout_s`` without one."""
        pending = self.pending_key(queue, worker_id)
        held = self.redis.lindex(pending, -1)
        if held is not None:
            return as_text(held)
        self.redis.sadd(self._queue_key("pending_index", queue), worker_id)
        instant = self._queue_key("instant", queue)
        # redis-py annotates the timeout as int; BLMOVE takes seconds as a float (Redis >= 6).
        return as_text(self.redis.blmove(instant, pending, timeout_s, "RIGHT", "LEFT"))  # type: ignore[arg-type]

    @_wrapped
    def ack_job(self, queue: str, worker_id: str, job: str) -> None:
        self.run_script("ack", [self.pending_key(queue, worker_id), self._queue_key("index", queue)], [job])

    @_wrapped
    def retry_job(self, queue: str, worker_id: str, job: str, delay_ms: int) -> None:
        """The job runs again in ``delay_ms`` (pending -> scheduled)."""
        self.run_script("retry", [self.pending_key(queue, worker_id), self._queue_key("scheduled", queue),
                                  self._queue_key("index", queue)], [job, max(0, delay_ms)])

    @_wrapped
    def promote_due(self, queue: str, limit: int = 1000) -> int:
        """Scheduled jobs whose time has come become instant; returns how many."""
        return int(self.run_script("promote", [self._queue_key("scheduled", queue),
                                               self._queue_key("instant", queue)], [limit]))

    @_wrapped
    def job_lengths(self, queue: str) -> QueueLengths:
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(self._queue_key("instant", queue))
        pipe.zcard(self._queue_key("scheduled", queue))
        pipe.smembers(self._queue_key("pending_index", queue))
        instant, scheduled, workers = pipe.execute()
        pending = 0
        if workers:
            pipe = self.redis.pipeline(transaction=False)
            for worker in workers:
                pipe.llen(self.pending_key(queue, as_text(worker)))
            pending = sum(pipe.execute())
        return QueueLengths(instant=int(instant), scheduled=int(scheduled), pending=int(pending))

    @_wrapped
    def heartbeat(self, worker_ids: list[str]) -> None:
        """These workers are alive (Redis time), so the scrubber leaves their jobs alone."""
        self.run_script("heartbeat", [self.workers_key], worker_ids)

    @_wrapped
    def scrub(self, max_age_ms: int) -> tuple[int, int]:
        """Put back the pending jobs of workers unseen for ``max_age_ms``, each delivery among them as
        a failed one of its subscriber (the worker died holding it); (jobs put back, workers forgotten)."""
        s = self.settings
        jobs, forgotten = self.run_script("scrub", [self.workers_key],
                                          [self.prefix, max_age_ms, s.damage_rate, s.max_backoff_ms, *QUEUES])
        return int(jobs), int(forgotten)


def event_json(topic: str, type_: str, url: str, timestamp: int, data: dict[str, Any] | None,
               traceparent: str | None = None) -> str:
    """An event exactly as a subscriber receives it (``timestamp`` is ``t``; no ``data`` if null;
    ``traceparent`` only when its publish carried one)."""
    event: dict[str, Any] = {"topic": topic, "type": type_, "url": url, "t": timestamp}
    if data is not None:
        event["data"] = data
    if traceparent is not None:
        event["traceparent"] = traceparent
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)
