"""Pool topology against the real RabbitMQ, read back through the management API."""

from __future__ import annotations

import subprocess
import sys

import pytest

from switchyard.errors import PoolNotFoundError
from switchyard.rpc import protocol as p
from switchyard.rpc.management import ManagementApi
from switchyard.rpc.settings import RpcSettings
from switchyard.rpc.topology import PoolTopology
from tests.conftest import subprocess_env, unique, wait_for
from tests.rpc.conftest import delete_pool


@pytest.fixture
def api() -> ManagementApi:
    return ManagementApi(RpcSettings.from_env().connections.management_url)


def test_declare_twice_is_a_no_op(make_pool, api: ManagementApi) -> None:
    pool, settings = make_pool()
    with PoolTopology(pool, settings) as topology:
        topology.declare()
        topology.declare()
    names = {q["name"] for q in api.list_queues(f"^{pool}-", columns="name")}
    assert names == {p.orphan_queue(pool), p.dl_queue(pool), p.activity_queue(pool), p.poison_queue(pool)}


def test_declare_from_two_processes_at_once() -> None:
    pool = unique("t")
    settings = RpcSettings.from_env()
    cmd = [sys.executable, "-m", "switchyard", "pool", "init", "--pool", pool]
    try:
        procs = [subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(3)]
        results = [(proc.wait(60), proc.stderr.read().decode()) for proc in procs]
        assert [code for code, _ in results] == [0, 0, 0], results
        with PoolTopology(pool, settings) as topology:
            assert topology.exists()
    finally:
        delete_pool(settings, pool)


def test_pool_queues_are_durable_not_exclusive_and_bound(pool, api: ManagementApi) -> None:
    name, _ = pool
    for queue in (p.orphan_queue(name), p.dl_queue(name), p.activity_queue(name), p.poison_queue(name)):
        info = api.get_queue(queue)
        assert info is not None, queue
        assert info["durable"] is True and info["exclusive"] is False and info["auto_delete"] is False
        assert info["type"] == "quorum"
    req = api.get_exchange(p.req_exchange(name))
    assert req["type"] == "direct" and req["durable"] is True
    assert req["arguments"]["alternate-exchange"] == p.orphan_exchange(name)
    for exchange in (p.orphan_exchange(name), p.dl_exchange(name), p.activity_exchange(name)):
        assert api.get_exchange(exchange)["type"] == "fanout"


def test_request_queue_policy_is_in_effect(make_pool, api: ManagementApi) -> None:
    pool, settings = make_pool(message_ttl_ms=12_345, delivery_limit=3)
    with PoolTopology(pool, settings) as topology:
        queue = topology.ensure_request_queue("some key")
    policy = api.get_policy(p.request_policy_name(pool))
    assert policy["apply-to"] == "queues"
    assert policy["priority"] > 0
    # The management API reports a new queue's policy a moment after the queue exists.
    info = wait_for(lambda: (q := api.get_queue(queue)) and "effective_policy_definition" in q and q,
                    what="the queue's effective policy")
    assert info["type"] == "quorum"
    assert info["policy"] == p.request_policy_name(pool)
    effective = info["effective_policy_definition"]
    assert effective["dead-letter-exchange"] == p.dl_exchange(pool)
    assert effective["delivery-limit"] == 3
    assert effective["message-ttl"] == 12_345
    # The request policy does not leak onto the pool's own queues.
    dl_info = wait_for(lambda: api.get_queue(p.dl_queue(pool)).get("policy"), what="the dl queue's policy")
    assert dl_info == p.pool_queues_policy_name(pool)


def test_classic_queues_are_selectable_for_development(make_pool, api: ManagementApi) -> None:
    pool, settings = make_pool(queue_type=p.QueueType.CLASSIC)
    with PoolTopology(pool, settings) as topology:
        queue = topology.ensure_request_queue("k")
    info = wait_for(lambda: (q := api.get_queue(queue)) and "effective_policy_definition" in q and q,
                    what="the queue's effective policy")
    assert info["type"] == "classic"
    assert info["effective_policy_definition"]["dead-letter-exchange"] == p.dl_exchange(pool)
    assert "delivery-limit" not in info["effective_policy_definition"]


def test_request_queue_for_every_odd_key_is_created_and_bound(pool, api: ManagementApi) -> None:
    from tests.rpc.test_protocol import ODD_KEYS

    name, settings = pool
    with PoolTopology(name, settings) as topology:
        for key in ODD_KEYS:
            topology.ensure_request_queue(key)
    bindings = api._request("GET", f"/exchanges/%2F/{p.req_exchange(name)}/bindings/source").json()
    routed = {(b["destination"], b["routing_key"]) for b in bindings}
    assert routed == {(p.request_queue(name, k), p.routing_key(k)) for k in ODD_KEYS}


def test_unknown_pool_is_reported_clearly() -> None:
    with PoolTopology(unique("never"), RpcSettings.from_env()) as topology:
        assert topology.exists() is False
        with pytest.raises(PoolNotFoundError, match="switchyard pool init"):
            topology.require()


def test_an_orphan_that_expires_before_any_handler_is_dead_lettered_not_dropped(pool, api) -> None:
    """With no control plane running, an orphan's own expiration still produces a dead letter."""
    import pika

    from tests.rpc.conftest import get_message

    name, settings = pool
    info = wait_for(lambda: (q := api.get_queue(p.orphan_queue(name))) and q.get("policy") and q,
                    what="the orphan queue's policy")
    assert info["policy"] == p.orphan_policy_name(name)
    assert info["effective_policy_definition"]["dead-letter-exchange"] == p.dl_exchange(name)
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    try:
        connection.channel().basic_publish(
            p.req_exchange(name), "no-such-key", b"lonely",
            pika.BasicProperties(expiration="200", correlation_id="c1", reply_to="r",
                                 headers={p.KEY_HEADER: "no-such-key"}))
    finally:
        connection.close()
    dead = get_message(settings, p.dl_queue(name), timeout=10)
    assert dead is not None, "the expired orphan was dropped"
    _, props, body = dead
    assert body == b"lonely" and props.correlation_id == "c1"
    assert props.headers[p.FIRST_DEATH_REASON_HEADER] == "expired"
    assert props.headers["x-first-death-queue"] == p.orphan_queue(name)
