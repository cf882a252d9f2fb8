"""RabbitMQ's at-least-once dead-lettering trap (rabbitmq-server#16652), on the suite's own 4.0 broker.

A quorum queue with ``dead-letter-strategy: at-least-once`` starts a dead-letter worker under the
node's one supervisor, ``rabbit_fifo_dlx_sup``, whenever it elects a leader. Delete the queue while
that worker is still starting (the second or so after a broker restart, or after a leader moves)
and the worker crash-loops until the supervisor gives up: from then on every at-least-once quorum
queue that starts or elects a leader crashes (``INTERNAL_ERROR`` on declare), and the ones already
running stop dead-lettering, until the node restarts. Measured here on 4.0.5: ONE such queue
deleted right after a restart is enough, every time.

These tests restart the 4.0 broker (scripts/rabbitmq4.sh) and always leave it running with the
supervisor alive (restarted if a test stranded it), so the next run starts from a healthy broker.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pika
import pika.exceptions
import pytest
import redis

from switchyard.core.config import Connections
from switchyard.rpc import protocol
from switchyard.rpc.control.management import ManagementApi
from switchyard.rpc.control.reconciler import Reconciler
from switchyard.rpc.control.topology import BrokerProbe, PoolTopology
from switchyard.rpc.errors import DeadLetteringStrandedError
from switchyard.rpc.settings import Delays, RpcSettings
from switchyard.rpc.store import PROBE_PREFIX, PoolState
from tests.conftest import unique, wait_for
from tests.faults.scenarios import ensure_rabbitmq4, rabbitmq4, rabbitmq4_dead_lettering, restart_rabbitmq4

KEYS = [f"k{i}" for i in range(10)]


@pytest.fixture
def broker4() -> Iterator[RpcSettings]:
    """The 4.0 broker, healthy before the test and after it (restarted if the test stranded it)."""
    ensure_rabbitmq4()
    if rabbitmq4_dead_lettering() != "running":
        restart_rabbitmq4()
    yield RpcSettings(connections=rabbitmq4())
    if rabbitmq4_dead_lettering() != "running":
        restart_rabbitmq4()
    assert rabbitmq4_dead_lettering() == "running"


def delete_pools(settings: RpcSettings, *pools: str) -> None:
    for pool in pools:
        with PoolTopology(pool, settings) as topology:
            topology.delete(force=True)


def test_deletions_right_after_a_restart_leave_new_pools_and_keys_working(broker4: RpcSettings) -> None:
    """The failing run's sequence, made deterministic: request queues of a pool and a whole pool
    deleted by Switchyard's own operations (the reconciler's queue delete, ``pool delete``) within a
    second of a broker restart. Afterwards the supervisor still runs, a new pool and a new key are
    declared, and an orphan still crosses the staging hop at least once."""
    kept, doomed, fresh = unique("dlxa"), unique("dlxb"), unique("dlxc")
    for pool in (kept, doomed):
        with PoolTopology(pool, broker4) as topology:
            topology.declare()
            topology.ensure_request_queues(KEYS, likely_new=KEYS)
    try:
        restart_rabbitmq4()
        with PoolTopology(kept, broker4) as topology:
            for key in KEYS:
                topology.delete_request_queue(key)
        delete_pools(broker4, doomed)
        time.sleep(2)  # window: a crash loop, when there is one, ends the supervisor within milliseconds
        assert rabbitmq4_dead_lettering() == "running"
        with PoolTopology(fresh, broker4) as topology:
            topology.declare()
            topology.ensure_request_queue("new-key")
            assert topology.queue_status(protocol.request_queue(fresh, "new-key")) == (0, 0)
        with pika.BlockingConnection(pika.URLParameters(broker4.connections.amqp_url)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish(protocol.req_exchange(fresh), "nobody-serves-this", b"orphan",
                                  pika.BasicProperties(delivery_mode=2))
            orphans = protocol.orphan_queue(fresh)
            wait_for(lambda: channel.queue_declare(orphans, passive=True).method.message_count == 1,
                     timeout=10, what="the orphan to cross the staging hop")
    finally:
        delete_pools(broker4, kept, fresh)


def _delete_as_soon_as_it_can(connection: pika.BlockingConnection, name: str) -> None:
    """Delete ``name`` right after the restart: while its leader is still coming up the broker answers
    404 "may be stopping or being demoted" (and closes the channel); ask again at once, a new channel
    each time, for at most 5 s."""
    deadline = time.monotonic() + 5
    while True:
        try:
            connection.channel().queue_delete(name)
            return
        except pika.exceptions.ChannelClosedByBroker as refused:
            if refused.reply_code != 404 or "leader" not in refused.reply_text or time.monotonic() > deadline:
                raise


def strand(settings: RpcSettings) -> None:
    """The bug's own recipe, outside Switchyard: at-least-once quorum queues deleted right after a
    restart. What Switchyard cannot prevent (another application on the broker, a cluster's leader
    churn) must still be detected. The race is tight: five queues, up to three tries."""
    connections: Connections = settings.connections
    management = ManagementApi(connections.management_url)
    prefix = unique("dlx-victim")
    management.put_policy(prefix, f"^{prefix}-", {"dead-letter-exchange": "amq.fanout",
                                                 "overflow": "reject-publish",
                                                 protocol.DEAD_LETTER_STRATEGY: protocol.AT_LEAST_ONCE}, 0)
    victims = [f"{prefix}-{i}" for i in range(5)]
    try:
        for _ in range(3):
            with pika.BlockingConnection(pika.URLParameters(connections.amqp_url)) as connection:
                for name in victims:
                    connection.channel().queue_declare(name, durable=True,
                                                       arguments={"x-queue-type": "quorum"})
            restart_rabbitmq4()
            with pika.BlockingConnection(pika.URLParameters(connections.amqp_url)) as connection:
                for name in victims:
                    _delete_as_soon_as_it_can(connection, name)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: rabbitmq4_dead_lettering() == "stranded", timeout=3,
                         what="the supervisor to stop")
                return
        raise AssertionError("three restarts and deletions did not strand the broker: has #16652 been fixed?")
    finally:
        management.delete_policy(prefix)


def test_a_stranded_broker_is_detected_named_and_alarmed(broker4: RpcSettings) -> None:
    """The probe, a pool declare and the reconciler's pass each see the stranded state and say how to
    recover; nothing of the probe's is left on the broker."""
    management = ManagementApi(broker4.connections.management_url)
    pool = unique("dlxd")
    strand(broker4)
    with PoolTopology(pool, broker4) as topology:
        result = topology.probe_dead_lettering()
        assert result.stranded and "reboot" in result.detail.lower()
        with pytest.raises(DeadLetteringStrandedError, match="reboot"):
            topology.declare()
    state = PoolState(redis.Redis.from_url(broker4.connections.redis_url), pool)
    with PoolTopology(pool, broker4) as topology:
        probe = BrokerProbe(topology)
        # The broker's probe turn is shared by every reconciler of it (a control plane of an earlier
        # test or scenario on this broker may hold it for its 240 s): this pass takes it.
        state.redis.delete(f"{PROBE_PREFIX}{{{probe.broker}}}")
        outcome = Reconciler(state, topology, _NoDriver(), Delays(), probe=probe,
                             probe_interval_s=0.001).run_pass()
    assert outcome.dead_lettering_stranded == 1
    restart_rabbitmq4()
    with PoolTopology(pool, broker4) as topology:
        assert not topology.probe_dead_lettering().stranded
    delete_pools(broker4, pool)
    assert management.list_queues(f"^{protocol.DEAD_LETTER_PROBE_PREFIX}") == []


class _NoDriver:
    """The reconciler's pass needs a driver; this one runs nothing."""

    def list_running(self, pool: str) -> set[str]:
        return set()
