"""Declares a pool's exchanges, queues, bindings and policies (the keyed RPC design, "Exchanges and queues").

Every operation is idempotent and safe to run from several processes at once: declares of the
same entity with the same arguments are no-ops in RabbitMQ, and policies are PUT whole.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from switchyard.core.errors import BrokerUnavailableError
from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.amqp import connect, consume_answered, is_alive
from switchyard.rpc.control.dead_lettering import (
    ProbeResult,
    broker_id,
    is_stranding,
    probe,
    retired,
    stranded_error,
)
from switchyard.rpc.control.management import ManagementApi, vhost_from_amqp_url
from switchyard.rpc.errors import PoolNotEmptyError, PoolNotFoundError, TopologyError
from switchyard.rpc.settings import PoolPolicy, RpcSettings

# Pool queues hold orphans and dead letters, which must not be dropped by a broker default
# (Amazon MQ 4.x gives quorum queues a delivery limit of 20 and these queues have no DLX).
POOL_QUEUE_DELIVERY_LIMIT = 1_000_000


def _dead_lettering(policy: PoolPolicy, pool: str, delivery_limit: int) -> dict[str, Any]:
    """At-most-once (see switchyard/rpc/control/dead_lettering.py): a request's dead letter is an answer about
    its failure, and its caller's own deadline stands behind it. Request queues come and go with
    their keys, and deleting an at-least-once queue can stop the broker's dead-letter supervisor."""
    definition: dict[str, Any] = {"dead-letter-exchange": protocol.dl_exchange(pool)}
    if policy.queue_type is protocol.QueueType.QUORUM:
        definition["delivery-limit"] = delivery_limit
        definition[protocol.DEAD_LETTER_STRATEGY] = protocol.AT_MOST_ONCE
    return definition


def request_policy_definition(policy: PoolPolicy, pool: str) -> dict[str, Any]:
    return {**_dead_lettering(policy, pool, policy.delivery_limit), "message-ttl": policy.message_ttl_ms}


def orphan_policy_definition(policy: PoolPolicy, pool: str) -> dict[str, Any]:
    """A failing orphan handler never exhausts a delivery limit. An orphan left unhandled longer
    than a request may wait (the control plane is down) expires and is answered ``expired`` by the
    dead-letter responder: not dropped, and the queue does not grow without bound."""
    return {**_dead_lettering(policy, pool, POOL_QUEUE_DELIVERY_LIMIT), "message-ttl": policy.message_ttl_ms}


def staging_policy_definition(policy: PoolPolicy, target_queue: str, strategy: str) -> dict[str, Any]:
    """Expire every message at once into ``target_queue`` through the default exchange, which makes
    the broker record its routing key in ``x-death``. On quorum queues, ``strategy`` at-least-once
    keeps a message in staging until the target has confirmed it: the orphan hop carries requests.
    Activity reports are hints that the next report repeats: at-most-once."""
    definition: dict[str, Any] = {"message-ttl": 0, "dead-letter-exchange": "",
                                  "dead-letter-routing-key": target_queue}
    if policy.queue_type is protocol.QueueType.QUORUM:
        definition.update({protocol.DEAD_LETTER_STRATEGY: strategy,
                           "delivery-limit": POOL_QUEUE_DELIVERY_LIMIT})
        if strategy == protocol.AT_LEAST_ONCE:
            definition["overflow"] = "reject-publish"  # at-least-once requires it
    return definition


P = ParamSpec("P")
R = TypeVar("R")


Method = Callable[Concatenate["PoolTopology", P], R]


def _broker_errors(method: Method[P, R]) -> Method[P, R]:
    """A ``ports.RequestQueues`` method raises Switchyard's errors only: a refusal is already a
    ``TopologyError``; a connection lost under it (pika's ``AMQPError``) becomes
    ``BrokerUnavailableError``, raised from it."""

    @functools.wraps(method)
    def translated(self: PoolTopology, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except pika.exceptions.AMQPError as exc:
            raise BrokerUnavailableError(f"{method.__name__} on pool {self.pool!r}: {exc!r}") from exc

    return translated


class PoolTopology:
    """The broker-side shape of one pool. Use as a context manager; it owns one connection.

    The adapter behind ``ports.RequestQueues``: the control loops' view of the pool's queues.
    """

    def __init__(self, pool: str, settings: RpcSettings | None = None) -> None:
        self.pool = protocol.validate_pool(pool)
        self.settings = settings or RpcSettings.from_env()
        self.policy = self.settings.policy
        conn = self.settings.connections
        self.management = ManagementApi(conn.management_url, vhost_from_amqp_url(conn.amqp_url))
        self._connection: pika.BlockingConnection | None = None
        self._chan: BlockingChannel | None = None
        self._helpers: list[PoolTopology] = []

    @property
    def queue_type(self) -> protocol.QueueType:
        return self.policy.queue_type

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
        connection, self._connection, self._chan = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):  # a connection the broker reset
                connection.close()

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
        arguments: dict[str, Any] = {protocol.QUEUE_TYPE_ARGUMENT: self.policy.queue_type.value}
        if key is not None:
            arguments[protocol.KEY_QUEUE_ARGUMENT] = key
        return arguments

    def _placement_arguments(self) -> dict[str, Any]:
        """Where a new quorum queue's members and leader go (protocol.LEADER_LOCATOR_ARGUMENT); a
        queue's creation only: redeclared, a queue made without them is used as it is."""
        if self.policy.queue_type is not protocol.QueueType.QUORUM:
            return {}
        return {protocol.LEADER_LOCATOR_ARGUMENT: protocol.BALANCED,
                protocol.INITIAL_GROUP_SIZE_ARGUMENT: self.policy.initial_group_size}

    # -- pool -------------------------------------------------------------------------------
    def declare(self) -> None:
        """Create everything the pool needs; re-running it changes nothing.

        The orphan and activity exchanges feed staging queues that dead-letter into the queues
        the handlers consume, so ``x-death`` carries each message's routing key (see protocol).
        A pool declared before staging existed is moved over: the staging binding is made first,
        then the direct one removed (a message routed in between arrives twice, never not at all).
        """
        pool = self.pool
        self._put_policies()
        self._exchange(protocol.orphan_exchange(pool), "fanout")
        self._exchange(protocol.dl_exchange(pool), "fanout")
        self._exchange(protocol.activity_exchange(pool), "fanout")
        self._exchange(protocol.req_exchange(pool), "direct",
                       {"alternate-exchange": protocol.orphan_exchange(pool)})
        for queue in protocol.pool_queue_names(pool):
            self._queue(queue)
        channel = self._channel()
        channel.queue_bind(protocol.dl_queue(pool), protocol.dl_exchange(pool))
        for exchange, target in ((protocol.orphan_exchange(pool), protocol.orphan_queue(pool)),
                                 (protocol.activity_exchange(pool), protocol.activity_queue(pool))):
            channel.queue_bind(target + protocol.STAGING_SUFFIX, exchange)
            channel.queue_unbind(target, exchange)
        logger.info("pool declared", extra={"pool": pool, "queue_type": self.policy.queue_type.value})

    def _policies(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every policy of the pool: ``(name, pattern, definition)``."""
        pool = self.pool
        policies = [
            (protocol.request_policy_name(pool), protocol.request_policy_pattern(pool),
             request_policy_definition(self.policy, pool)),
            (protocol.orphan_policy_name(pool), protocol.orphan_policy_pattern(pool),
             orphan_policy_definition(self.policy, pool)),
            *((protocol.staging_policy_name(pool, target), protocol.staging_policy_pattern(target),
               staging_policy_definition(self.policy, target, strategy))
              for target, strategy in ((protocol.orphan_queue(pool), protocol.AT_LEAST_ONCE),
                                       (protocol.activity_queue(pool), protocol.AT_MOST_ONCE))),
        ]
        if self.policy.queue_type is protocol.QueueType.QUORUM:
            policies.append((protocol.pool_queues_policy_name(pool),
                             protocol.pool_queues_policy_pattern(pool),
                             {"delivery-limit": POOL_QUEUE_DELIVERY_LIMIT}))
        return policies

    def _put_policies(self) -> None:
        for name, pattern, definition in self._policies():
            self.management.put_policy(name, pattern, definition, self.policy.priority)

    def own_queues(self) -> list[str]:
        """The queues that are this pool's by name: the fixed ones and every request queue whose
        name Switchyard could have made (other applications' ``{pool}-...`` queues are not)."""
        names = [q for q in protocol.pool_queue_names(self.pool) if self.queue_status(q) is not None]
        listed = self.list_request_queues(columns="name,arguments")
        names += [q["name"] for q in listed
                  if protocol.key_from_request_queue(self.pool, q["name"], q.get("arguments")) is not None]
        return names

    def delete(self, force: bool = False) -> int:
        """Remove the pool: its own queues, exchanges and policies, and nothing of anyone else's.

        Unless ``force``, refuses (``PoolNotEmptyError``) while any of its queues holds messages,
        counted exactly by passive declare; returns the number of messages dropped. The activity
        queue does not count: it holds the workers' own telemetry, not anyone's requests.
        """
        queues = self.own_queues()
        if not force:
            telemetry = protocol.activity_queue(self.pool)
            waiting = {q: status[0] for q in queues
                       if q != telemetry and (status := self.queue_status(q)) and status[0]}
            if waiting:
                raise PoolNotEmptyError(self.pool, waiting)
        at_least_once = self._at_least_once_definitions()
        dropped = 0
        for queue in queues:
            if queue in at_least_once:
                with retired(self.management, queue, at_least_once[queue], self.policy.priority):
                    dropped += self._channel().queue_delete(queue).method.message_count
            else:
                dropped += self._channel().queue_delete(queue).method.message_count
        for exchange in (protocol.req_exchange(self.pool), protocol.orphan_exchange(self.pool),
                         protocol.dl_exchange(self.pool), protocol.activity_exchange(self.pool)):
            self._channel().exchange_delete(exchange)
        for name, _, _ in self._policies():
            self.management.delete_policy(name)
        return dropped

    def _at_least_once_definitions(self) -> dict[str, dict[str, Any]]:
        """The pool's queues whose policy dead-letters at least once, with that policy's definition."""
        return {pattern[1:-1]: definition for _, pattern, definition in self._policies()
                if definition.get(protocol.DEAD_LETTER_STRATEGY) == protocol.AT_LEAST_ONCE}

    def probe_dead_lettering(self, where: RpcSettings | None = None) -> ProbeResult:
        """Whether the broker can still start an at-least-once queue (see dead_lettering.probe), probed
        with this topology's connection or in ``where`` (the probe's own vhost and user)."""
        if where is not None:
            with PoolTopology(self.pool, where) as elsewhere:
                return elsewhere.probe_dead_lettering()
        return probe(self._channel, self.management, self.policy.priority)

    def exists(self) -> bool:
        """Whether the pool's request exchange exists (passive declare)."""
        try:
            self._channel().exchange_declare(protocol.req_exchange(self.pool), passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == protocol.NOT_FOUND:
                return False
            raise TopologyError(f"checking pool {self.pool!r}: {exc.reply_text}") from exc
        return True

    def require(self) -> None:
        if not self.exists():
            raise PoolNotFoundError(
                f"pool {self.pool!r} is not initialized (no exchange {protocol.req_exchange(self.pool)!r}); "
                f"run: switchyard pool init --pool {self.pool}"
            )

    # -- request queues ---------------------------------------------------------------------
    @_broker_errors
    def ensure_request_queue(self, key: str, bind: bool = True) -> str:
        """Declare ``{pool}-req-{key}`` and (by default) bind it to the request exchange by key."""
        queue = protocol.request_queue(self.pool, key)
        self._queue(queue, key)
        if bind:
            self.bind_request_queue(key)
        return queue

    @_broker_errors
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
                self._channel().queue_bind(protocol.request_queue(self.pool, key),
                                           protocol.req_exchange(self.pool),
                                           routing_key=protocol.routing_key(key))
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != protocol.NOT_FOUND:
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
            f"binding {protocol.request_queue(self.pool, key)!r}",
            lambda ch: ch.queue_bind(protocol.request_queue(self.pool, key), protocol.req_exchange(self.pool),
                                     routing_key=protocol.routing_key(key)),
        )

    @_broker_errors
    def unbind_request_queue(self, key: str) -> None:
        self._guard(
            f"unbinding {protocol.request_queue(self.pool, key)!r}",
            lambda ch: ch.queue_unbind(protocol.request_queue(self.pool, key),
                                       protocol.req_exchange(self.pool),
                                       routing_key=protocol.routing_key(key)),
        )

    @_broker_errors
    def delete_request_queue(self, key: str) -> None:
        """Delete unconditionally: callers check emptiness first (quorum queues refuse if-empty)."""
        self._guard(f"deleting {protocol.request_queue(self.pool, key)!r}",
                    lambda ch: ch.queue_delete(protocol.request_queue(self.pool, key)))

    @_broker_errors
    def list_request_queues(self, columns: str) -> list[dict[str, Any]]:
        """The pool's ``{pool}-req-*`` queues from the management API, with ``columns``."""
        return self.management.list_queues(f"^{protocol.request_queue_prefix(self.pool)}", columns=columns)

    @_broker_errors
    def answers_consume(self, queue: str, timeout_s: float) -> bool:
        """``amqp.consume_answered`` on a connection of its own (a leaderless queue blocks a channel)."""
        return consume_answered(self.settings.connections.amqp_url, queue, timeout_s)

    @_broker_errors
    def queue_status(self, queue: str) -> tuple[int, int] | None:
        """``(ready messages, consumers)`` by passive declare (exact, unlike the management
        API's sampled stats), or None if the queue does not exist."""
        try:
            frame = self._channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == protocol.NOT_FOUND:
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
        """Declare a durable queue; an existing one of another type is accepted as it is, and one
        made before Switchyard placed its queues (``_placement_arguments``) is used without a word."""
        arguments = self._queue_arguments(key)
        placement = self._placement_arguments()
        try:
            self._declare(name, {**arguments, **placement})
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != protocol.PRECONDITION_FAILED:
                raise TopologyError(f"declaring queue {name!r}: {exc.reply_text}") from exc
            if placement and self._declared_as(name, arguments):
                return
            # Declared earlier with other arguments (e.g. classic vs quorum): it exists; use it.
            self._channel().queue_declare(name, passive=True)
            logger.warning("queue exists with other arguments; using it as is",
                           extra={"queue": name, "reason": exc.reply_text})

    def _declared_as(self, name: str, arguments: dict[str, Any]) -> bool:
        """Whether ``name`` exists with exactly ``arguments`` (a declare that changes nothing)."""
        try:
            self._declare(name, arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != protocol.PRECONDITION_FAILED:
                raise TopologyError(f"declaring queue {name!r}: {exc.reply_text}") from exc
            return False
        return True

    def _declare(self, name: str, arguments: dict[str, Any]) -> None:
        try:
            self._channel().queue_declare(name, durable=True, arguments=arguments)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            if is_stranding(exc):
                raise stranded_error(f"declaring queue {name!r}") from exc
            raise

    def _guard(self, what: str, operation: Any) -> None:
        try:
            operation(self._channel())
        except pika.exceptions.ChannelClosedByBroker as exc:
            raise TopologyError(f"{what}: {exc.reply_text}") from exc


class BrokerProbe:
    """The ``ports.DeadLetteringProbe`` of a pool's broker: ``PoolTopology.probe_dead_lettering`` with
    the topology's connection, or in ``where`` (the probe's own vhost and user)."""

    def __init__(self, topology: PoolTopology, where: RpcSettings | None = None) -> None:
        self._topology, self._where = topology, where
        self.broker = broker_id(topology.settings.connections.amqp_url)

    def stranded(self) -> bool:
        return self._topology.probe_dead_lettering(self._where).stranded


def init_pool(pool: str, settings: RpcSettings | None = None) -> None:
    """Declare a pool's topology (the Python twin of ``switchyard pool init``)."""
    with PoolTopology(pool, settings) as topology:
        topology.declare()
