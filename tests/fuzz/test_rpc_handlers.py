"""Fuzz the RPC control-plane handlers (functions/rpc_*.py) on the real RabbitMQ and Redis.

Each generated batch mixes good messages with broken ones. Properties: the handler returns (it
raises only when the broker fails, which it does not here); every good message is processed
(orphans forwarded into their key's queue, dead letters answered on their reply-to, activity
counted for its key); every broken one is counted in the outcome.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pika.exceptions
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from switchyard.aws import services
from switchyard.rpc import protocol
from switchyard.rpc.drivers import NoopDriver
from switchyard.rpc.service import ControlPlane
from switchyard.rpc.settings import ControlSettings, Delays
from tests.fuzz.conftest import examples
from tests.fuzz.events import rmq_event, rmq_message, scheduled_event
from tests.rpc.conftest import PoolFactory, flush_pool_state, make_pool, redis_client  # noqa: F401
from tests.rpc.test_handlers_malformed import Env

KEYS = ["plain", "clé à espaces", "", "k" * 300]


@pytest.fixture
def rpc_fuzz(make_pool: PoolFactory, redis_client: redis.Redis) -> Iterator[Env]:  # noqa: F811
    """A pool (classic queues: thousands of generated messages) whose control plane has no workers."""
    pool, settings = make_pool(queue_type=protocol.QueueType.CLASSIC)
    plane = ControlPlane(ControlSettings(pool, Delays(30, 30), 1.0), settings, NoopDriver(), redis_client)
    services.control_plane.install(plane)
    env = Env(pool, settings, plane)
    yield env
    with contextlib.suppress(pika.exceptions.AMQPError):  # idle through a long test: heartbeats missed
        env.connection.close()
    services.control_plane.install(None)
    plane.close()
    flush_pool_state(redis_client, pool)


@settings(max_examples=examples(0.12))
@given(data=st.data())
def test_orphans_forwards_every_good_orphan_and_counts_every_broken_one(rpc_fuzz: Env, data) -> None:
    f = rpc_fuzz
    cases = data.draw(st.lists(rmq_message(reply_to=f.reply_queue, keys=KEYS), min_size=1, max_size=8))
    outcome = f.call("rpc_orphans", rmq_event(cases, protocol.orphan_queue(f.pool)))
    assert outcome["orphans"] == len(cases)
    assert outcome["malformed_fields"] == sum(not c.good for c in cases)
    assert outcome["without_key"] == sum(c.key is None for c in cases)
    assert outcome["forwarded"] == sum(c.key is not None for c in cases)
    forwarded = {props.correlation_id: (props, body) for key in {c.key for c in cases if c.key is not None}
                 for props, body in f.drain(protocol.request_queue(f.pool, key))}
    for case in cases:
        if case.good:
            props, body = forwarded[case.ident]
            assert body == case.extra["body"]
            assert props.headers[protocol.KEY_HEADER] == case.key
    f.drain(f.reply_queue)  # MissingKey answers of the keyless ones


@settings(max_examples=examples(0.12))
@given(data=st.data())
def test_dead_letters_answers_every_good_one_and_counts_every_broken_one(rpc_fuzz: Env, data) -> None:
    f = rpc_fuzz
    cases = data.draw(st.lists(rmq_message(reply_to=f.reply_queue, keys=KEYS, dead_letter=True),
                               min_size=1, max_size=8))
    outcome = f.call("rpc_dead_letters", rmq_event(cases, protocol.dl_queue(f.pool)))
    assert outcome["dead_letters"] == len(cases)
    assert outcome["malformed_fields"] == sum(not c.good for c in cases)
    answers = {props.correlation_id: props.headers[protocol.STATUS_HEADER]
               for props, _ in f.drain(f.reply_queue)}
    for case in cases:
        if case.good:
            reason = case.message["basicProperties"]["headers"][protocol.FIRST_DEATH_REASON_HEADER]
            assert answers[case.ident] == bytes(b & 0xFF for b in reason["bytes"]).decode()


@settings(max_examples=examples(0.1))
@given(data=st.data())
def test_activity_counts_every_good_report_and_every_broken_one(rpc_fuzz: Env, data) -> None:
    f = rpc_fuzz
    cases = data.draw(st.lists(rmq_message(reply_to=f.reply_queue, keys=KEYS, activity=True),
                               min_size=1, max_size=8))
    outcome = f.call("rpc_activity", rmq_event(cases, protocol.activity_queue(f.pool)))
    assert outcome["events"] == len(cases)
    assert outcome["keys"] == len({c.key for c in cases if c.key is not None})
    assert outcome["without_key"] == sum(c.key is None for c in cases)
    assert outcome["malformed_fields"] == sum(not c.good for c in cases)


@settings(max_examples=examples(0.02))
@given(scheduled_event())
def test_reconcile_takes_any_scheduled_event(rpc_fuzz: Env, event: dict) -> None:
    outcome = rpc_fuzz.call("rpc_reconcile", event)
    assert isinstance(outcome, dict)
