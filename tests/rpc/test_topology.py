"""Pool topology against the real RabbitMQ, read back through the management API."""

from __future__ import annotations

import logging
import subprocess
import sys

import pika
import pytest

from switchyard.rpc import protocol
from switchyard.rpc.control.management import ManagementApi
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.errors import PoolNotFoundError
from switchyard.rpc.settings import RpcSettings
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
    assert names == set(protocol.pool_queue_names(pool))
    assert len(protocol.pool_queue_names(pool)) == 6


def test_listing_beyond_one_page_reads_the_vhost_once_and_filters_it(make_pool, api: ManagementApi) -> None:
    pool, settings = make_pool()
    with PoolTopology(pool, settings) as topology:
        topology.declare()
        topology.ensure_request_queues(["a", "b", "c"], likely_new=["a", "b", "c"])
    requests_made = []
    api._session.hooks["response"].append(lambda response, *_, **__: requests_made.append(response.url))
    one_page = api.list_queues(f"^{pool}-", columns="name")
    assert {q["name"] for q in one_page} == {*protocol.pool_queue_names(pool),
                                             *(protocol.request_queue(pool, k) for k in "abc")}
    assert len(requests_made) == 1
    requests_made.clear()
    listed = api.list_queues(f"^{protocol.request_queue_prefix(pool)}", columns="messages", page_size=2)
    assert sorted(q["name"] for q in listed) == sorted(protocol.request_queue(pool, k) for k in "abc")
    assert all("messages" in q for q in listed) or all("messages" not in q for q in listed)
    assert len(requests_made) == 2  # the first page, then the whole vhost once (not page after page)
    assert "page" not in requests_made[1]


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
    for queue in protocol.pool_queue_names(name):
        info = api.get_queue(queue)
        assert info is not None, queue
        assert info["durable"] is True and info["exclusive"] is False and info["auto_delete"] is False
        assert info["type"] == "quorum"
    req = api.get_exchange(protocol.req_exchange(name))
    assert req["type"] == "direct" and req["durable"] is True
    assert req["arguments"]["alternate-exchange"] == protocol.orphan_exchange(name)
    for exchange in (protocol.orphan_exchange(name), protocol.dl_exchange(name),
                     protocol.activity_exchange(name)):
        assert api.get_exchange(exchange)["type"] == "fanout"


def test_request_queue_policy_is_in_effect(make_pool, api: ManagementApi) -> None:
    pool, settings = make_pool(message_ttl_ms=12_345, delivery_limit=3)
    with PoolTopology(pool, settings) as topology:
        queue = topology.ensure_request_queue("some key")
    policy = api.get_policy(protocol.request_policy_name(pool))
    assert policy["apply-to"] == "queues"
    assert policy["priority"] > 0
    # The management API reports a new queue's policy a moment after the queue exists.
    info = wait_for(lambda: (q := api.get_queue(queue)) and "effective_policy_definition" in q and q,
                    what="the queue's effective policy")
    assert info["type"] == "quorum"
    assert info["policy"] == protocol.request_policy_name(pool)
    effective = info["effective_policy_definition"]
    assert effective["dead-letter-exchange"] == protocol.dl_exchange(pool)
    assert effective["delivery-limit"] == 3
    assert effective["message-ttl"] == 12_345
    # The request policy does not leak onto the pool's own queues.
    dl_info = wait_for(lambda: api.get_queue(protocol.dl_queue(pool)).get("policy"),
                       what="the dl queue's policy")
    assert dl_info == protocol.pool_queues_policy_name(pool)


def test_classic_queues_are_selectable_for_development(make_pool, api: ManagementApi) -> None:
    pool, settings = make_pool(queue_type=protocol.QueueType.CLASSIC)
    with PoolTopology(pool, settings) as topology:
        queue = topology.ensure_request_queue("k")
    info = wait_for(lambda: (q := api.get_queue(queue)) and "effective_policy_definition" in q and q,
                    what="the queue's effective policy")
    assert info["type"] == "classic"
    assert info["effective_policy_definition"]["dead-letter-exchange"] == protocol.dl_exchange(pool)
    assert "delivery-limit" not in info["effective_policy_definition"]


def test_new_quorum_queues_are_placed_and_queues_made_before_are_used_as_they_are(
        make_pool, api: ManagementApi, caplog: pytest.LogCaptureFixture) -> None:
    """Placement (balanced leader, the initial group size) is fixed at creation: a queue made without
    it (by an earlier version) refuses a declare with it, and is then used as it is, silently."""
    pool, settings = make_pool(initial_group_size=2)
    placed = {protocol.LEADER_LOCATOR_ARGUMENT: protocol.BALANCED, protocol.INITIAL_GROUP_SIZE_ARGUMENT: 2}
    old = protocol.request_queue(pool, "old")
    with pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url)) as connection:
        connection.channel().queue_declare(old, durable=True, arguments={
            protocol.QUEUE_TYPE_ARGUMENT: protocol.QueueType.QUORUM.value,
            protocol.KEY_QUEUE_ARGUMENT: "old"})
    with PoolTopology(pool, settings) as topology:
        topology.declare()
        topology.ensure_request_queues(["new", "old"], likely_new=["new", "old"])
        assert topology.queue_status(old) == (0, 0)
    queues = {q["name"]: q["arguments"] for q in api.list_queues(f"^{pool}-", columns="name,arguments")}
    new = [*protocol.pool_queue_names(pool), protocol.request_queue(pool, "new")]
    assert all(queues[q].items() >= placed.items() for q in new)
    assert protocol.LEADER_LOCATOR_ARGUMENT not in queues[old]
    assert not [r for r in caplog.records if r.name.startswith("switchyard") and r.levelno >= logging.WARNING]
    assert exchange_bindings(api, protocol.req_exchange(pool)) >= {old, protocol.request_queue(pool, "new")}


def test_request_queue_for_every_odd_key_is_created_and_bound(pool, api: ManagementApi) -> None:
    from tests.rpc.test_protocol import ODD_KEYS

    name, settings = pool
    with PoolTopology(name, settings) as topology:
        for key in ODD_KEYS:
            topology.ensure_request_queue(key)
    bindings = api._request("GET", f"/exchanges/%2F/{protocol.req_exchange(name)}/bindings/source").json()
    routed = {(b["destination"], b["routing_key"]) for b in bindings}
    assert routed == {(protocol.request_queue(name, k), protocol.routing_key(k)) for k in ODD_KEYS}


def test_unknown_pool_is_reported_clearly() -> None:
    with PoolTopology(unique("never"), RpcSettings.from_env()) as topology:
        assert topology.exists() is False
        with pytest.raises(PoolNotFoundError, match="switchyard pool init"):
            topology.require()


def exchange_bindings(api: ManagementApi, exchange: str) -> set[str]:
    bindings = api._request("GET", f"/exchanges/%2F/{exchange}/bindings/source").json()
    return {b["destination"] for b in bindings}


def test_orphans_and_reports_pass_through_staging_and_keep_their_routing_key(pool, api) -> None:
    """Seed 000's plain messages carry the key only as routing key, which Lambda's event drops:
    the staging hop writes it into ``x-death``, with the request's expiration."""
    import pika

    from tests.rpc.conftest import get_message

    name, settings = pool
    assert exchange_bindings(api, protocol.orphan_exchange(name)) == {protocol.orphan_staging_queue(name)}
    assert exchange_bindings(api, protocol.activity_exchange(name)) == {protocol.activity_staging_queue(name)}
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    try:
        channel = connection.channel()
        channel.basic_publish(protocol.req_exchange(name), "infra=42 é", b"plain",
                              pika.BasicProperties(expiration="2000", correlation_id="c1", reply_to="r"))
        channel.basic_publish(protocol.activity_exchange(name), "infra=42 é", b"",
                              pika.BasicProperties(headers={protocol.EVENT_HEADER: "started"}))
    finally:
        connection.close()
    for queue, expiration in ((protocol.orphan_queue(name), "2000"), (protocol.activity_queue(name), None)):
        got = get_message(settings, queue, timeout=10)
        assert got is not None, f"nothing reached {queue}"
        _, props, _ = got
        death = props.headers[protocol.DEATH_HEADER][0]
        assert death["routing-keys"] == ["infra=42 é"]
        assert death["queue"] == queue + protocol.STAGING_SUFFIX
        assert death.get("original-expiration") == expiration and props.expiration is None


def test_a_pool_declared_before_staging_is_moved_over(pool, api) -> None:
    name, settings = pool
    with PoolTopology(name, settings) as topology:  # the old shape: handlers' queues bound directly
        channel = topology._channel()
        channel.queue_bind(protocol.orphan_queue(name), protocol.orphan_exchange(name))
        channel.queue_bind(protocol.activity_queue(name), protocol.activity_exchange(name))
        assert protocol.orphan_queue(name) in exchange_bindings(api, protocol.orphan_exchange(name))
        topology.declare()
    assert exchange_bindings(api, protocol.orphan_exchange(name)) == {protocol.orphan_staging_queue(name)}
    assert exchange_bindings(api, protocol.activity_exchange(name)) == {protocol.activity_staging_queue(name)}


def test_an_orphan_left_unhandled_past_the_request_ttl_is_dead_lettered_not_dropped(make_pool, api) -> None:
    """With no control plane running, an orphan waits a request TTL, then becomes a dead letter
    (which the dead-letter responder answers ``expired``): the queue does not grow for ever."""
    import pika

    from tests.rpc.conftest import get_message

    name, settings = make_pool(message_ttl_ms=300)
    info = wait_for(lambda: (q := api.get_queue(protocol.orphan_queue(name))) and q.get("policy") and q,
                    what="the orphan queue's policy")
    assert info["policy"] == protocol.orphan_policy_name(name)
    assert info["effective_policy_definition"]["dead-letter-exchange"] == protocol.dl_exchange(name)
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    try:
        connection.channel().basic_publish(
            protocol.req_exchange(name), "no-such-key", b"lonely",
            pika.BasicProperties(expiration="60000", correlation_id="c1", reply_to="r"))
    finally:
        connection.close()
    dead = get_message(settings, protocol.dl_queue(name), timeout=10)
    assert dead is not None, "the unhandled orphan was dropped"
    _, props, body = dead
    assert body == b"lonely" and props.correlation_id == "c1"
    assert props.headers[protocol.DEATH_HEADER][0]["reason"] == "expired"
    assert props.headers[protocol.DEATH_HEADER][0]["queue"] == protocol.orphan_queue(name)


def test_pool_delete_removes_only_its_own_queues_and_counts_exactly(make_pool, api) -> None:
    """Other applications' ``{pool}-...`` queues survive, and the emptiness check is exact (the
    management API's sampled counts lag by seconds and once let 3 confirmed requests be dropped)."""
    from switchyard.rpc.errors import PoolNotEmptyError

    name, settings = make_pool()
    foreign = [f"{name}-other-app", f"{name}-req-%FF", f"{name}-req-x~y"]
    with PoolTopology(name, settings) as topology:
        topology.ensure_request_queue("k")
        channel = topology._channel()
        for queue in foreign:
            channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for i in range(3):  # published and confirmed just before the delete: not yet in any sample
            channel.basic_publish(protocol.req_exchange(name), "k", f"r{i}".encode(), mandatory=True)
        with pytest.raises(PoolNotEmptyError, match=r"3 messages .*--force"):
            topology.delete()
        assert topology.queue_status(protocol.request_queue(name, "k")) == (3, 0)
        assert topology.delete(force=True) == 3
        for queue in protocol.pool_queue_names(name):
            assert topology.queue_status(queue) is None, queue
        assert topology.queue_status(protocol.request_queue(name, "k")) is None
        for queue in foreign:
            assert topology.queue_status(queue) == (0, 0), f"{queue} was not ours to delete"
            topology._channel().queue_delete(queue)
    assert not {pol["name"] for pol in api._request("GET", "/policies").json()
                if pol["name"].startswith(f"switchyard-{name}-")}


def test_only_the_orphan_staging_hop_dead_letters_at_least_once(pool, api) -> None:
    """rabbitmq-server#16652: deleting an at-least-once queue at the wrong moment stops the broker's
    dead-letter supervisor. Request queues come and go, so they (and every queue whose dead letters
    are only answers or hints) dead-letter at most once; the hop that carries requests keeps
    at-least-once."""
    name, settings = pool
    with PoolTopology(name, settings) as topology:
        request_queue = topology.ensure_request_queue("k")
    at_least_once = {protocol.orphan_staging_queue(name)}
    for queue in (*protocol.pool_queue_names(name), request_queue):
        info = wait_for(lambda q=queue: (i := api.get_queue(q)) and "effective_policy_definition" in i and i,
                        what=f"{queue}'s effective policy")
        strategy = info["effective_policy_definition"].get(protocol.DEAD_LETTER_STRATEGY)
        if queue in at_least_once:
            assert strategy == protocol.AT_LEAST_ONCE, queue
        elif "dead-letter-exchange" in info["effective_policy_definition"]:
            assert strategy == protocol.AT_MOST_ONCE, queue


def test_pool_delete_retires_at_least_once_queues_and_leaves_no_policy(make_pool, api) -> None:
    """The at-least-once staging queue is turned at-most-once by an exact-name policy before it is
    deleted; the policy goes with it."""
    name, settings = make_pool()
    staging = protocol.orphan_staging_queue(name)
    in_force: list[dict | None] = []
    with PoolTopology(name, settings) as topology:
        channel = topology._channel()
        real_delete = channel.queue_delete

        def queue_delete(queue: str, *args: object, **kwargs: object) -> object:
            if queue == staging:  # which retire policy holds at the moment of the delete
                in_force.append(api.get_policy(protocol.retire_policy_name(staging)))
            return real_delete(queue, *args, **kwargs)

        channel.queue_delete = queue_delete
        topology.delete(force=True)
    assert len(in_force) == 1 and in_force[0] is not None, in_force
    assert in_force[0]["pattern"] == protocol.exact_queue_pattern(staging)
    assert in_force[0]["definition"][protocol.DEAD_LETTER_STRATEGY] == protocol.AT_MOST_ONCE
    assert in_force[0]["priority"] > settings.policy.priority
    assert api.get_queue(staging) is None
    assert not [pol for pol in api._request("GET", "/policies").json()
                if pol["name"].startswith(protocol.RETIRE_POLICY_PREFIX)]


def test_the_dead_lettering_probe_finds_a_healthy_broker_and_leaves_nothing(pool, api) -> None:
    name, settings = pool
    with PoolTopology(name, settings) as topology:
        first = topology.probe_dead_lettering()
        second = topology.probe_dead_lettering()
    assert not first.stranded and not second.stranded
    assert api.list_queues(f"^{protocol.DEAD_LETTER_PROBE_PREFIX}", columns="name") == []
    assert not [pol for pol in api._request("GET", "/policies").json()
                if pol["name"].startswith(protocol.RETIRE_POLICY_PREFIX)]
