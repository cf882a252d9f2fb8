"""Declares a pool's exchanges, queues, bindings and policies (seed 000, "Exchanges and queues").

Every operation is idempotent and safe to run from several processes at once: declares of the
same entity with the same arguments are no-ops in RabbitMQ, and policies are PUT whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from switchyard.errors import PoolNotFoundError, TopologyError
from switchyard.observability import logger
from switchyard.rpc import protocol as p
from switchyard.rpc.amqp import connect, is_alive
from switchyard.rpc.management import ManagementApi, vhost_from_amqp_url
from switchyard.rpc.settings import PoolPolicy, RpcSettings

NOT_FOUND = 404
PRECONDITION_FAILED = 406
# Pool queues hold orphans and dead letters, which must not be dropped by a broker default
# (Amazon MQ 4.x gives quorum queues a delivery limit of 20 and these queues have no DLX).
POOL_QUEUE_DELIVERY_LIMIT = 1_000_000


def _dead_lettering(policy: PoolPolicy, pool: str, delivery_limit: int) -> dict[str, Any]:
    definition: dict[str, Any] = {"dead-letter-exchange": p.dl_exchange(pool)}
    if policy.queue_type is p.QueueType.QUORUM:
        definition["delivery-limit"] = delivery_limit
        # Dead letters are requests whose caller awaits an answer: do not drop them in transit.
        definition["dead-letter-strategy"] = "at-least-once"
        definition["overflow"] = "reject-publish"
    return definition


def request_policy_definition(policy: PoolPolicy, pool: str) -> dict[str, Any]:
    return {**_dead_lettering(policy, pool, policy.delivery_limit), "message-ttl": policy.message_ttl_ms}


def orphan_policy_definition(policy: PoolPolicy, pool: str) -> dict[str, Any]:
    """An orphan whose own expiration passes while it waits is answered ``expired``, not dropped;
    a failing orphan handler never exhausts a delivery limit."""
    return _dead_lettering(policy, pool, POOL_QUEUE_DELIVERY_LIMIT)


class PoolTopology:
    """The broker-side shape of one pool. Use as a context manager; it owns one connection."""

    def __init__(self, pool: str, settings: RpcSettings | None = None) -> None:
        self.pool = p.validate_pool(pool)
        self.settings = settings or RpcSettings.from_env()
        self.policy = self.settings.policy
        conn = self.settings.connections
        self.management = ManagementApi(conn.management_url, vhost_from_amqp_url(conn.amqp_url))
        self._connection: pika.BlockingConnection | None = None
        self._chan: BlockingChannel | None = None
        self._helpers: list[PoolTopology] = []

    # -- connection -------------------------------------------------------------------------
    def __enter__(self) -> PoolTopology:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for helper in self._helpers:
            helper.close()
        self._helpers = []
        if self._connection is not None and self._connection.is_open:
            self._connection.close()
        self._connection = self._chan = None

    def refresh(self) -> None:
        """Drop a connection the broker closed while it sat idle (call before reusing it)."""
        if self._connection is not None and not is_alive(self._connection):
            self._connection = self._chan = None

    def _channel(self) -> BlockingChannel:
        if self._connection is None or not self._connection.is_open:
            self._connection = connect(self.settings.connections.amqp_url, f"switchyard-topology-{self.pool}")
            self._chan = None
        if self._chan is None or not self._chan.is_open:
            self._chan = self._connection.channel()
        return self._chan

    def _queue_arguments(self, key: str | None = None) -> dict[str, Any]:
        arguments: dict[str, Any] = {p.QUEUE_TYPE_ARGUMENT: self.policy.queue_type.value}
        if key is not None:
            arguments[p.KEY_QUEUE_ARGUMENT] = key
        return arguments

    # -- pool -------------------------------------------------------------------------------
    def declare(self) -> None:
        """Create everything the pool needs; re-running it changes nothing."""
        pool = self.pool
        self._put_policies()
        self._exchange(p.orphan_exchange(pool), "fanout")
        self._exchange(p.dl_exchange(pool), "fanout")
        self._exchange(p.activity_exchange(pool), "fanout")
        self._exchange(p.req_exchange(pool), "direct", {"alternate-exchange": p.orphan_exchange(pool)})
        for queue, exchange in (
            (p.orphan_queue(pool), p.orphan_exchange(pool)),
            (p.dl_queue(pool), p.dl_exchange(pool)),
            (p.activity_queue(pool), p.activity_exchange(pool)),
            (p.poison_queue(pool), None),
        ):
            self._queue(queue)
            if exchange is not None:
                self._channel().queue_bind(queue, exchange)
        logger.info("pool declared", extra={"pool": pool, "queue_type": self.policy.queue_type.value})

    def _put_policies(self) -> None:
        pool = self.pool
        self.management.put_policy(
            p.request_policy_name(pool),
            p.request_policy_pattern(pool),
            request_policy_definition(self.policy, pool),
            self.policy.priority,
        )
        self.management.put_policy(
            p.orphan_policy_name(pool),
            p.orphan_policy_pattern(pool),
            orphan_policy_definition(self.policy, pool),
            self.policy.priority,
        )
        if self.policy.queue_type is p.QueueType.QUORUM:
            self.management.put_policy(
                p.pool_queues_policy_name(pool),
                p.pool_queues_policy_pattern(pool),
                {"delivery-limit": POOL_QUEUE_DELIVERY_LIMIT},
                self.policy.priority,
            )

    def delete(self) -> int:
        """Remove the pool: every queue (messages included), exchange and policy. Returns the
        number of messages dropped, so callers can refuse or report it."""
        dropped = 0
        queues = self.management.list_queues(f"^{self.pool}-", columns="name,messages")
        for queue in queues:
            if queue["name"].startswith(self.pool + "-"):
                frame = self._channel().queue_delete(queue["name"])
                dropped += frame.method.message_count
        for exchange in (p.req_exchange(self.pool), p.orphan_exchange(self.pool),
                         p.dl_exchange(self.pool), p.activity_exchange(self.pool)):
            self._channel().exchange_delete(exchange)
        self.management.delete_policy(p.request_policy_name(self.pool))
        self.management.delete_policy(p.pool_queues_policy_name(self.pool))
        self.management.delete_policy(p.orphan_policy_name(self.pool))
        return dropped

    def exists(self) -> bool:
        """Whether the pool's request exchange exists (passive declare)."""
        try:
            self._channel().exchange_declare(p.req_exchange(self.pool), passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == NOT_FOUND:
                return False
            raise TopologyError(f"checking pool {self.pool!r}: {exc.reply_text}") from exc
        return True

    def require(self) -> None:
        if not self.exists():
            raise PoolNotFoundError(
                f"pool {self.pool!r} is not initialized (no exchange {p.req_exchange(self.pool)!r}); "
                f"run: switchyard pool init --pool {self.pool}"
            )

    # -- request queues ---------------------------------------------------------------------
    def ensure_request_queue(self, key: str, bind: bool = True) -> str:
        """Declare ``{pool}-req-{key}`` and (by default) bind it to the request exchange by key."""
        queue = p.request_queue(self.pool, key)
        self._queue(queue, key)
        if bind:
            self.bind_request_queue(key)
        return queue

    def ensure_request_queues(self, keys: Iterable[str], likely_new: Iterable[str] = (),
                              parallel: int = 8) -> None:
        """``ensure_request_queue`` for many keys, fast: a batch of orphans may name 100 keys.

        Keys in ``likely_new`` are declared first, over up to ``parallel`` connections at once
        (creating a quorum queue takes the broker milliseconds); the others are only bound, and
        declared if the bind finds no queue.
        """
        new = list(dict.fromkeys(likely_new))
        new_set = set(new)
        known = [k for k in dict.fromkeys(keys) if k not in new_set]
        missing = []
        for key in known:
            try:
                self._channel().queue_bind(p.request_queue(self.pool, key), p.req_exchange(self.pool),
                                           routing_key=p.routing_key(key))
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != NOT_FOUND:
                    raise TopologyError(f"binding the queue of {key!r}: {exc.reply_text}") from exc
                missing.append(key)
        to_declare = new + missing
        lanes = max(1, min(parallel, len(to_declare) // 4))
        while len(self._helpers) < lanes - 1:
            self._helpers.append(PoolTopology(self.pool, self.settings))
        for helper in self._helpers[: lanes - 1]:
            helper.refresh()
        chunks = [to_declare[i::lanes] for i in range(lanes)]
        if lanes == 1:
            self._declare_and_bind(chunks[0])
            return
        with ThreadPoolExecutor(lanes, thread_name_prefix=f"declare-{self.pool}") as pool:
            futures = [pool.submit(t._declare_and_bind, chunk)
                       for t, chunk in zip([self, *self._helpers], chunks, strict=False)]
            for future in futures:
                future.result()

    def _declare_and_bind(self, keys: list[str]) -> None:
        for key in keys:
            self.ensure_request_queue(key)

    def bind_request_queue(self, key: str) -> None:
        self._guard(
            f"binding {p.request_queue(self.pool, key)!r}",
            lambda ch: ch.queue_bind(p.request_queue(self.pool, key), p.req_exchange(self.pool),
                                     routing_key=p.routing_key(key)),
        )

    def unbind_request_queue(self, key: str) -> None:
        self._guard(
            f"unbinding {p.request_queue(self.pool, key)!r}",
            lambda ch: ch.queue_unbind(p.request_queue(self.pool, key), p.req_exchange(self.pool),
                                       routing_key=p.routing_key(key)),
        )

    def delete_request_queue(self, key: str) -> None:
        """Delete unconditionally: callers check emptiness first (quorum queues refuse if-empty)."""
        self._guard(f"deleting {p.request_queue(self.pool, key)!r}",
                    lambda ch: ch.queue_delete(p.request_queue(self.pool, key)))

    def queue_status(self, queue: str) -> tuple[int, int] | None:
        """``(ready messages, consumers)`` by passive declare (exact, unlike the management
        API's sampled stats), or None if the queue does not exist."""
        try:
            frame = self._channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == NOT_FOUND:
                return None
            raise TopologyError(f"inspecting {queue!r}: {exc.reply_text}") from exc
        return frame.method.message_count, frame.method.consumer_count

    # -- helpers ----------------------------------------------------------------------------
    def _exchange(self, name: str, kind: str, arguments: dict[str, Any] | None = None) -> None:
        self._guard(
            f"declaring exchange {name!r}",
            lambda ch: ch.exchange_declare(name, kind, durable=True, arguments=arguments),
        )

    def _queue(self, name: str, key: str | None = None) -> None:
        """Declare a durable queue; an existing one of another type is accepted as it is."""
        try:
            self._channel().queue_declare(name, durable=True, arguments=self._queue_arguments(key))
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != PRECONDITION_FAILED:
                raise TopologyError(f"declaring queue {name!r}: {exc.reply_text}") from exc
            # Declared earlier with other arguments (e.g. classic vs quorum): it exists; use it.
            self._channel().queue_declare(name, passive=True)
            logger.warning("queue exists with other arguments; using it as is",
                           extra={"queue": name, "reason": exc.reply_text})

    def _guard(self, what: str, operation: Any) -> None:
        try:
            operation(self._channel())
        except pika.exceptions.ChannelClosedByBroker as exc:
            raise TopologyError(f"{what}: {exc.reply_text}") from exc


def init_pool(pool: str, settings: RpcSettings | None = None) -> None:
    """Declare a pool's topology (the Python twin of ``switchyard pool init``)."""
    with PoolTopology(pool, settings) as topology:
        topology.declare()
