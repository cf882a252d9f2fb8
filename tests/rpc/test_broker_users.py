"""Per-role broker users on the real RabbitMQ: each role does its job, and nothing more.

The users are made as the pools custom resource makes them (``deploy.declare_pools`` with ``Users``:
each user's secret in Secrets Manager, moto here), then every role connects as itself: a client's
call goes through the orphan path (the mappings user reads the orphan, the orphans user forwards
it), a worker serves it, the activity tracker and the reconciler (with the dead-lettering probe) run
their pass, the dead-letter responder answers; then each user is refused what it must not do.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TypeVar
from urllib.parse import quote, urlsplit

import boto3
import pika
import pika.exceptions
import pytest
import redis
import requests

from switchyard.aws import deploy
from switchyard.core.config import Connections, service_urls
from switchyard.delay.model import InputRecord
from switchyard.rpc import protocol
from switchyard.rpc.amqp import consume_answered
from switchyard.rpc.client import RpcClient
from switchyard.rpc.client.schedule import collect, declare_reply_queue
from switchyard.rpc.control.access import DEPLOYMENT_WIDE, BrokerRole, BrokerUser, deployment_users
from switchyard.rpc.control.management import ManagementApi, vhost_from_amqp_url
from switchyard.rpc.control.publisher import ConfirmingPublisher
from switchyard.rpc.control.rmq_event import AmqpMessage
from switchyard.rpc.control.scheduled import relay_scheduled
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.drivers.noop import NoopDriver
from switchyard.rpc.scheduling import ScheduledCall, scheduled_headers
from switchyard.rpc.service import ControlPlane
from switchyard.rpc.settings import ControlSettings, Delays, RpcSettings
from tests.conftest import unique, wait_for
from tests.rpc.conftest import WorkerProcesses, delete_pool, flush_pool_state

MOTO = "http://127.0.0.1:5000"
T = TypeVar("T")
ACCESS_REFUSED = 403


@dataclass
class Deployed:
    pool: str
    other: str  # a second pool of the same deployment
    admin: RpcSettings
    secrets: dict[BrokerUser, str]  # user -> secret ARN
    passwords: dict[BrokerUser, tuple[str, str]]  # user -> (username, password)
    applications: list[str]  # two applications, each with its own clients user
    probe_vhost: str

    def control(self, delays: Delays | None = None) -> ControlSettings:
        """A reconcile function's control settings: the probe in its vhost, as the probe's user."""
        return ControlSettings(self.pool, delays or Delays(), dead_letter_probe_interval_s=0.001,
                               dead_letter_probe_vhost=self.probe_vhost,
                               dead_letter_probe_secret_arn=self.secrets[BrokerUser(BrokerRole.PROBE)])

    def template(self, url: str) -> str:
        """The admin's ``url`` (each of a cluster's list) with ``{username}``/``{password}``
        placeholders, as a deployment has it."""
        return ",".join(with_user(one, "{username}", "{password}") for one in service_urls(url))

    def settings(self, role: BrokerRole, pool: str | None = None) -> RpcSettings:
        """What a Lambda function of ``role`` builds: URLs with placeholders, filled from its secret."""
        user = BrokerUser(role, None if role in DEPLOYMENT_WIDE else (pool or self.pool))
        admin = self.admin.connections
        connections = Connections(amqp_url=self.template(admin.amqp_url),
                                  management_url=self.template(admin.management_url),
                                  redis_url=admin.redis_url,
                                  secret_sources={"SWITCHYARD_AMQP_SECRET_ARN": self.secrets[user]})
        return replace(self.admin, connections=connections)

    def connect(self, role: BrokerRole, pool: str | None = None) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.settings(role, pool).connections.amqp_url))

    def connect_application(self, application: str) -> pika.BlockingConnection:
        """A connection as ``application``'s own clients user."""
        name, password = self.passwords[BrokerUser(BrokerRole.CLIENTS, application=application)]
        url = with_user(service_urls(self.admin.connections.amqp_url)[0], name, password)
        return pika.BlockingConnection(pika.URLParameters(url))


def with_user(url: str, username: str, password: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=f"{username}:{password}@{parts.hostname}:{parts.port}").geturl()


@pytest.fixture
def deployed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployed]:
    """Two pools and every user of their deployment, made by the pools custom resource's code."""
    for name, value in (("AWS_ENDPOINT_URL", MOTO), ("AWS_DEFAULT_REGION", "us-east-1"),
                        ("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, os.environ.get(name) or value)
    admin = RpcSettings.from_env()
    pools, applications = [unique("u"), unique("u")], [unique("app").replace("-", "_") for _ in range(2)]
    probe_vhost = unique("probe")
    sm = boto3.client("secretsmanager")
    secrets, passwords = {}, {}
    for user in deployment_users(pools, applications):
        # Deployment-wide users are one per deployment: made unique here, as the shared broker holds other
        # runs'.
        name = user.username if user.pool or user.application else f"{user.username}-{pools[0]}"
        passwords[user] = (name, unique("pw"))
        secrets[user] = sm.create_secret(Name=unique("broker-user"), SecretString=json.dumps(
            {"username": name, "password": passwords[user][1]}))["ARN"]
    event = {"RequestType": "Create", "ResourceProperties": {
        "Pools": pools, "ProbeVhost": probe_vhost,
        "Users": [{"Role": u.role.value, "Pool": u.pool or "", "Application": u.application or "",
                   "SecretArn": arn} for u, arn in secrets.items()]}}
    conn = admin.connections
    management = ManagementApi(conn.management_url, vhost_from_amqp_url(conn.amqp_url))
    try:
        answer = deploy.declare_pools(event)
        assert sorted(answer["Data"]["Users"].split(",")) == sorted(n for n, _ in passwords.values())
        yield Deployed(pools[0], pools[1], admin, secrets, passwords, applications, probe_vhost)
    finally:
        ManagementApi(conn.management_url, probe_vhost).delete_vhost()
        for name, _ in passwords.values():
            management.delete_user(name)
        for pool in pools:
            delete_pool(admin, pool)
        for arn in secrets.values():
            sm.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)


def _as(deployed: Deployed, role: BrokerRole, redis_client: redis.Redis, work: Callable[[ControlPlane], T],
        delays: Delays | None = None) -> T:
    """``work`` on a control plane of ``role``'s Lambda function, as that function builds it."""
    plane = ControlPlane(deployed.control(delays), deployed.settings(role), NoopDriver(), redis_client)
    try:
        return work(plane)
    finally:
        plane.close()


def _take(deployed: Deployed, queue: str, count: int = 1, timeout: float = 10.0) -> list[AmqpMessage]:
    """What an event source mapping hands its function: read as the mappings user, acked after."""
    connection = deployed.connect(BrokerRole.MAPPINGS)
    try:
        channel, taken = connection.channel(), []

        def all_taken() -> bool:
            method, props, body = channel.basic_get(queue)
            if method is not None:
                taken.append(AmqpMessage(body, props, method.redelivered, queue))
                channel.basic_ack(method.delivery_tag)
            return len(taken) >= count

        wait_for(all_taken, timeout, interval=0.05, required=False)
        assert len(taken) == count, f"{queue}: {len(taken)} of {count} messages"
        return taken
    finally:
        connection.close()


def test_every_role_does_its_job_as_its_own_user(deployed: Deployed, workers: WorkerProcesses,
                                                  redis_client: redis.Redis) -> None:
    pool, key = deployed.pool, "k1"
    with RpcClient(pool, deployed.settings(BrokerRole.CLIENTS), timeout=60) as client:
        answer = client.submit(key, b"hello")
        # The orphan handler, fed by the mappings user, declares, binds and forwards as the orphans user.
        orphans = _take(deployed, protocol.orphan_queue(pool))
        outcome = _as(deployed, BrokerRole.ORPHANS, redis_client, lambda cp: cp.forward_orphans(orphans))
        assert (outcome.forwarded, outcome.new_groups) == (1, 1)
        # A worker as ECS starts it: the workers user's credentials injected into a placeholder URL.
        name, password = deployed.passwords[BrokerUser(BrokerRole.WORKERS, pool)]
        workers.start(pool, key, "tests.rpc.handlers:whoami", "w1",
                      SWITCHYARD_AMQP_URL=deployed.template(deployed.admin.connections.amqp_url),
                      SWITCHYARD_AMQP_USERNAME=name, SWITCHYARD_AMQP_PASSWORD=password,
                      WORKER_ACTIVITY_INTERVAL="0")
        assert answer.result(30).text() == f"w1|{key}|hello"

    # The activity tracker finds the group unknown (state lost): it declares and binds the queue again.
    flush_pool_state(redis_client, pool)
    reports = _take(deployed, protocol.activity_queue(pool), count=2)  # started, request-received
    tracked = _as(deployed, BrokerRole.ACTIVITY, redis_client, lambda plane: plane.track_activity(reports))
    assert tracked.reactivated == 1

    # The reconciler unbinds, then (the worker gone) deletes the queue, and probes the broker.
    workers.stop_all()
    first, second = _as(deployed, BrokerRole.RECONCILE, redis_client,
                        lambda plane: (plane.reconcile(), plane.reconcile()), Delays(unbind_s=0, stop_s=0))
    assert (first.unbound, second.queues_deleted) == (1, 1), (first, second)
    assert first.queue_errors == second.queue_errors == 0
    # Its dead-lettering probe (policies, a probe queue declared and deleted), which a pass runs only
    # on its turn among every pool on the broker: run as the reconciler runs it, in the probe's vhost
    # as the probe's user.
    with PoolTopology(pool, deployed.settings(BrokerRole.RECONCILE)) as topology:
        probe = deployed.control().probe_settings(topology.settings)
        assert probe is not None and not topology.probe_dead_lettering(probe).stranded
        # And its leaderless-queue probe, a consume on a request queue: a refusal would read as silence.
        topology.ensure_request_queue("k2")
    assert consume_answered(deployed.settings(BrokerRole.RECONCILE).connections.amqp_url,
                            protocol.request_queue(pool, "k2"), 10.0)

    # The dead-letter responder answers a dead letter on the caller's reply queue and keeps the poison.
    connection = deployed.connect(BrokerRole.CLIENTS)
    reply_queue = connection.channel().queue_declare("", exclusive=True).method.queue
    _dead_letter(deployed, reply_queue)
    dead = _take(deployed, protocol.dl_queue(pool))
    outcome = _as(deployed, BrokerRole.DEAD_LETTERS, redis_client, lambda cp: cp.respond_dead_letters(dead))
    assert (outcome.responses, outcome.poisoned) == (1, 1)
    method, props, _ = connection.channel().basic_get(reply_queue, auto_ack=True)
    connection.close()
    assert method is not None and props.headers[protocol.STATUS_HEADER] == protocol.Status.DELIVERY_LIMIT


def test_scheduled_calls_go_through_the_relay_and_clients_users(deployed: Deployed) -> None:
    """The client declares and reads its durable reply queue; the relay publishes into the pool and
    parks a refused call in the pool's poison queue, each as its own user."""
    reply = unique("r")
    queue = declare_reply_queue(deployed.settings(BrokerRole.CLIENTS), reply)
    publisher = ConfirmingPublisher(deployed.settings(BrokerRole.SCHEDULED).connections.amqp_url, "relay")
    try:
        now = int(time.time() * 1000)
        calls = [ScheduledCall("c-ok", deployed.pool, "k9", b"x", queue),
                 ScheduledCall("c-late", deployed.pool, "k9", b"y", queue, expires_ms=now - 1)]
        records = [InputRecord("out", 0, n, b"k9", c.body, tuple(
            (name, v) for name, v in scheduled_headers(c, datetime.now(UTC))
            if not name.startswith("chronos"))) for n, c in enumerate(calls)]
        outcome = relay_scheduled(records, publisher=publisher, parked=_NoParking(), now_ms=now)
        assert (outcome.published, outcome.expired, outcome.parked, outcome.failed) == (1, 1, 1, ())
        answers = collect(deployed.settings(BrokerRole.CLIENTS), reply, ["c-late"], timeout=10)
        assert answers["c-late"].status == protocol.Status.EXPIRED
    finally:
        publisher.close()
        connection = pika.BlockingConnection(pika.URLParameters(deployed.admin.connections.amqp_url))
        connection.channel().queue_delete(queue)
        connection.close()


class _NoParking:
    """Every call here has a pool: nothing may reach the store."""

    def park_records(self, records: list) -> None:
        raise AssertionError(f"parked in the store: {records}")


def _dead_letter(deployed: Deployed, reply_to: str) -> None:
    """A request dead-lettered at its delivery limit, as the broker routes it (admin: the broker's part)."""
    connection = pika.BlockingConnection(pika.URLParameters(deployed.admin.connections.amqp_url))
    try:
        props = pika.BasicProperties(reply_to=reply_to, correlation_id="c1", headers={
            protocol.FIRST_DEATH_REASON_HEADER: protocol.Status.DELIVERY_LIMIT.value,
            protocol.KEY_HEADER: "k1"})
        connection.channel().basic_publish(protocol.dl_exchange(deployed.pool), "k1", b"x", props)
    finally:
        connection.close()


# -- refusals ------------------------------------------------------------------------------------------
Operation = Callable[[pika.adapters.blocking_connection.BlockingChannel, Deployed], object]


def _publish(exchange: Callable[[Deployed], str], routing: Callable[[Deployed], str]) -> Operation:
    def run(channel: pika.adapters.blocking_connection.BlockingChannel, d: Deployed) -> None:
        channel.confirm_delivery()
        channel.basic_publish(exchange(d), routing(d), b"x")
    return run


def _consume(queue: Callable[[Deployed], str]) -> Operation:
    return lambda channel, d: channel.basic_consume(queue(d), lambda *_: None)


def _declare(queue: Callable[[Deployed], str]) -> Operation:
    return lambda channel, d: channel.queue_declare(queue(d), durable=True)


def _delete(queue: Callable[[Deployed], str]) -> Operation:
    return lambda channel, d: channel.queue_delete(queue(d))


def _delete_exchange(exchange: Callable[[Deployed], str]) -> Operation:
    return lambda channel, d: channel.exchange_delete(exchange(d))


def _own_request_queue(d: Deployed) -> str:
    return protocol.request_queue(d.pool, "k1")


def _other_request_queue(d: Deployed) -> str:
    return protocol.request_queue(d.other, "k1")


REFUSED: list[tuple[BrokerRole, str, Operation]] = [
    (BrokerRole.WORKERS, "read another pool's request queue", _consume(_other_request_queue)),
    (BrokerRole.WORKERS, "publish to another pool's request exchange",
     _publish(lambda d: protocol.req_exchange(d.other), lambda d: "k1")),
    (BrokerRole.WORKERS, "publish to its own pool's request exchange",
     _publish(lambda d: protocol.req_exchange(d.pool), lambda d: "k1")),
    (BrokerRole.WORKERS, "publish to another pool's activity exchange",
     _publish(lambda d: protocol.activity_exchange(d.other), lambda d: "k1")),
    (BrokerRole.WORKERS, "read its pool's orphans", _consume(lambda d: protocol.orphan_queue(d.pool))),
    (BrokerRole.WORKERS, "declare a queue", _declare(lambda d: protocol.request_queue(d.pool, "mine"))),
    (BrokerRole.WORKERS, "delete its request queue", _delete(_own_request_queue)),
    (BrokerRole.CLIENTS, "read a request queue", _consume(_own_request_queue)),
    (BrokerRole.CLIENTS, "publish through the default exchange",
     _publish(lambda d: "", _own_request_queue)),
    (BrokerRole.CLIENTS, "publish to an activity exchange",
     _publish(lambda d: protocol.activity_exchange(d.pool), lambda d: "k1")),
    (BrokerRole.CLIENTS, "declare a named queue", _declare(lambda d: protocol.request_queue(d.pool, "k2"))),
    (BrokerRole.CLIENTS, "read another durable queue", _consume(lambda d: protocol.poison_queue(d.pool))),
    (BrokerRole.SCHEDULED, "read a request queue", _consume(_own_request_queue)),
    (BrokerRole.SCHEDULED, "declare a queue", _declare(lambda d: protocol.reply_queue("mine"))),
    (BrokerRole.SCHEDULED, "publish to an activity exchange",
     _publish(lambda d: protocol.activity_exchange(d.pool), lambda d: "k1")),
    (BrokerRole.MAPPINGS, "read a request queue", _consume(_own_request_queue)),
    (BrokerRole.MAPPINGS, "read another pool's orphans", _consume(lambda d: protocol.orphan_queue(d.other))),
    (BrokerRole.MAPPINGS, "publish", _publish(lambda d: "", lambda d: protocol.orphan_queue(d.pool))),
    (BrokerRole.ORPHANS, "read its orphan queue", _consume(lambda d: protocol.orphan_queue(d.pool))),
    (BrokerRole.ORPHANS, "declare another pool's request queue", _declare(_other_request_queue)),
    (BrokerRole.ORPHANS, "publish to another pool's request exchange",
     _publish(lambda d: protocol.req_exchange(d.other), lambda d: "k1")),
    (BrokerRole.DEAD_LETTERS, "publish to the request exchange",
     _publish(lambda d: protocol.req_exchange(d.pool), lambda d: "k1")),
    (BrokerRole.DEAD_LETTERS, "declare a request queue",
     _declare(lambda d: protocol.request_queue(d.pool, "k2"))),
    (BrokerRole.ACTIVITY, "publish to another pool's request exchange",
     _publish(lambda d: protocol.req_exchange(d.other), lambda d: "k1")),
    (BrokerRole.ACTIVITY, "publish through the default exchange", _publish(lambda d: "", _own_request_queue)),
    (BrokerRole.ACTIVITY, "read a request queue", _consume(_own_request_queue)),
    (BrokerRole.RECONCILE, "read another pool's request queue", _consume(_other_request_queue)),
    (BrokerRole.RECONCILE, "delete its orphan queue", _delete(lambda d: protocol.orphan_queue(d.pool))),
    (BrokerRole.RECONCILE, "delete another pool's request queue", _delete(_other_request_queue)),
    (BrokerRole.RECONCILE, "publish through the default exchange",
     _publish(lambda d: "", _own_request_queue)),
    # Last: allowed, they would take the exchange the rows above publish to.
    *((role, "delete its pool's request exchange", _delete_exchange(lambda d: protocol.req_exchange(d.pool)))
      for role in (BrokerRole.ORPHANS, BrokerRole.ACTIVITY, BrokerRole.RECONCILE)),
]


@pytest.fixture
def request_queues(deployed: Deployed) -> Deployed:
    """``k1``'s request queue in both pools (the admin's doing), for the refusals to aim at."""
    for pool in (deployed.pool, deployed.other):
        with PoolTopology(pool, deployed.admin) as topology:
            topology.ensure_request_queue("k1")
    return deployed


def test_each_user_is_refused_what_its_role_does_not_do(request_queues: Deployed) -> None:
    deployed, allowed = request_queues, []
    for role, what, operation in REFUSED:
        connection = deployed.connect(role)
        try:
            operation(connection.channel(), deployed)
            allowed.append(f"{role}: {what}")
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code == ACCESS_REFUSED, (role, what, exc)
        finally:
            if connection.is_open:
                connection.close()
    assert not allowed, "allowed, and should not be:\n" + "\n".join(allowed)


def test_only_the_reconciler_uses_the_management_api(deployed: Deployed) -> None:
    base = urlsplit(service_urls(deployed.admin.connections.management_url)[0])
    answers = {}
    for role in BrokerRole:
        user = BrokerUser(role, None if role in DEPLOYMENT_WIDE else deployed.pool)
        name, password = deployed.passwords[user]
        url = f"{base.scheme}://{base.hostname}:{base.port}/api/queues/%2F?name=^{deployed.pool}-&use_regex=true"
        answers[role] = requests.get(url, auth=(name, password), timeout=10).status_code
    assert answers == {role: 200 if role is BrokerRole.RECONCILE else 401 for role in BrokerRole}


def test_the_pools_resource_refuses_to_demote_its_own_admin(deployed: Deployed) -> None:
    """A users secret naming the admin would strip the deploy's own rights: refused before any change."""
    admin_name = urlsplit(service_urls(deployed.admin.connections.management_url)[0]).username
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(Name=unique("broker-user"), SecretString=json.dumps(
        {"username": admin_name, "password": "not-the-admin's"}))["ARN"]
    try:
        with pytest.raises(Exception, match="cannot be the broker admin"):
            users = [{"Role": "workers", "Pool": deployed.pool, "SecretArn": arn}]
            deploy.declare_pools({"RequestType": "Update", "ResourceProperties": {
                "Pools": [deployed.pool], "Users": users}})
    finally:
        sm.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    with PoolTopology(deployed.pool, deployed.admin) as topology:  # the admin still works
        assert topology.exists()


def test_no_run_time_user_may_put_or_list_policies(deployed: Deployed) -> None:
    """``policymaker`` reaches every queue of each vhost its user may use: only the probe's user holds
    it, and only in the probe's vhost. No one else may drop another pool's requests by a policy, nor
    list the policies but the reconciler."""
    base = urlsplit(service_urls(deployed.admin.connections.management_url)[0])
    api = f"{base.scheme}://{base.hostname}:{base.port}/api"
    policy = {"pattern": f"^{protocol.request_queue_prefix(deployed.other)}", "definition": {"max-length": 0},
              "apply-to": "queues", "priority": 99}
    admin, granted = ManagementApi(deployed.admin.connections.management_url), []
    try:
        for user, (name, password) in deployed.passwords.items():
            if user.pool not in (None, deployed.pool):
                continue
            put = requests.put(f"{api}/policies/%2F/{name}", json=policy, auth=(name, password), timeout=10)
            listed = requests.get(f"{api}/policies/%2F", auth=(name, password), timeout=10)
            granted += [f"{user.role}: {what} {code}" for what, code in
                        (("put", put.status_code), ("list", listed.status_code)) if code < 400]
        # The reconciler's management tag (queue lists) shows the vhost's policies: read-only (security.md).
        granted.remove("reconcile: list 200")
        name, password = deployed.passwords[BrokerUser(BrokerRole.PROBE)]
        vhost = quote(deployed.probe_vhost, safe="")
        probe = {**policy, "pattern": f"^{protocol.DEAD_LETTER_PROBE_PREFIX}"}
        assert requests.put(f"{api}/policies/{vhost}/{name}", json=probe, auth=(name, password),
                            timeout=10).status_code == 201  # its own vhost: the probe's policies
    finally:
        for name, _ in deployed.passwords.values():
            admin.delete_policy(name)
    assert not granted, "may put or list the vhost's policies:\n" + "\n".join(granted)


def test_an_application_reads_and_deletes_only_its_own_reply_queues(deployed: Deployed) -> None:
    mine, theirs = deployed.applications
    owner = deployed.connect_application(mine)
    queue = protocol.reply_queue(f"{mine}.r1")
    owner.channel().queue_declare(queue, durable=True)
    refused = []
    try:
        for what, operation in (("read", lambda ch: ch.basic_consume(queue, lambda *_: None)),
                                ("delete", lambda ch: ch.queue_delete(queue)),
                                ("declare its own",
                                 lambda ch: ch.queue_declare(protocol.reply_queue(f"{mine}.x"),
                                                             durable=True))):
            other = deployed.connect_application(theirs)
            try:
                operation(other.channel())
            except pika.exceptions.ChannelClosedByBroker as exc:
                refused.append((what, exc.reply_code))
            finally:
                if other.is_open:
                    other.close()
        assert refused == [(w, ACCESS_REFUSED) for w in ("read", "delete", "declare its own")]
    finally:
        owner.channel().queue_delete(queue)  # its own: allowed
        owner.close()


def test_answers_go_only_to_reply_queues(request_queues: Deployed, workers: WorkerProcesses,
                                         redis_client: redis.Redis) -> None:
    """A ``reply_to`` naming a queue the caller may not write (another pool's request queue) gets no
    answer from the worker nor the dead-letter responder; the direct reply-to form does."""
    deployed, target = request_queues, protocol.request_queue(request_queues.other, "k1")
    connection = deployed.connect(BrokerRole.CLIENTS)
    channel, answers = connection.channel(), []
    channel.basic_consume(protocol.DIRECT_REPLY_TO, auto_ack=True,
                          on_message_callback=lambda _c, _m, props, _b: answers.append(props.correlation_id))
    for correlation, reply_to in (("aimed", target), ("direct", protocol.DIRECT_REPLY_TO)):
        channel.basic_publish(protocol.req_exchange(deployed.pool), protocol.routing_key("k1"), b"x",
                              pika.BasicProperties(correlation_id=correlation, reply_to=reply_to))
    name, password = deployed.passwords[BrokerUser(BrokerRole.WORKERS, deployed.pool)]
    workers.start(deployed.pool, "k1", "tests.rpc.handlers:whoami", "w1",
                  SWITCHYARD_AMQP_URL=deployed.template(deployed.admin.connections.amqp_url),
                  SWITCHYARD_AMQP_USERNAME=name, SWITCHYARD_AMQP_PASSWORD=password,
                  WORKER_ACTIVITY_INTERVAL="0")
    wait_for(lambda: connection.process_data_events(0.1) or answers, 30, what="the direct reply-to answer")
    connection.close()
    assert answers == ["direct"]  # in order: "aimed" was handled first, and answered nowhere
    with PoolTopology(deployed.other, deployed.admin) as topology:
        assert topology.queue_status(target) == (0, 0), "the worker answered into another pool's queue"
    _dead_letter(deployed, target)
    dead = _take(deployed, protocol.dl_queue(deployed.pool))
    outcome = _as(deployed, BrokerRole.DEAD_LETTERS, redis_client, lambda cp: cp.respond_dead_letters(dead))
    assert (outcome.responses, outcome.without_reply_to) == (0, 1)
    with PoolTopology(deployed.other, deployed.admin) as topology:
        assert topology.queue_status(target) == (0, 0), "the responder answered into another pool's queue"


def test_another_pools_workers_cannot_have_this_pools_handler_answer_them(
        request_queues: Deployed, workers: WorkerProcesses) -> None:
    """Every role that answers may write to the default exchange, which reaches any queue by name:
    pool B's workers published straight into pool A's request queue, with the direct reply-to form,
    and read A's answer. A worker now serves what came straight into its queue only from its own
    user (its shed copies); the stranger's request is poisoned with its reason, never answered."""
    deployed = request_queues
    client = deployed.connect(BrokerRole.CLIENTS)
    stranger = deployed.connect(BrokerRole.WORKERS, deployed.other)
    answers: list[tuple[str, str]] = []
    for who, connection in (("client", client), ("stranger", stranger)):
        channel = connection.channel()
        channel.basic_consume(protocol.DIRECT_REPLY_TO, auto_ack=True,
                              on_message_callback=lambda _c, _m, props, _b, who=who: answers.append(
                                  (who, props.correlation_id)))
        exchange, routing_key = ((protocol.req_exchange(deployed.pool), protocol.routing_key("k1"))
                                 if who == "client" else ("", protocol.request_queue(deployed.pool, "k1")))
        channel.basic_publish(exchange, routing_key, b"x",
                              pika.BasicProperties(correlation_id=who, reply_to=protocol.DIRECT_REPLY_TO))
    name, password = deployed.passwords[BrokerUser(BrokerRole.WORKERS, deployed.pool)]
    workers.start(deployed.pool, "k1", "tests.rpc.handlers:whoami", "w1",
                  SWITCHYARD_AMQP_URL=deployed.template(deployed.admin.connections.amqp_url),
                  SWITCHYARD_AMQP_USERNAME=name, SWITCHYARD_AMQP_PASSWORD=password,
                  WORKER_ACTIVITY_INTERVAL="0")
    admin = pika.BlockingConnection(pika.URLParameters(deployed.admin.connections.amqp_url))
    poisoned: list[pika.BasicProperties] = []

    def settled() -> bool:
        for connection in (client, stranger):
            connection.process_data_events(0.05)
        method, props, _body = admin.channel().basic_get(protocol.poison_queue(deployed.pool), auto_ack=True)
        if method is not None:
            poisoned.append(props)
        return bool(answers) and bool(poisoned)

    wait_for(settled, 30, what="the client's answer and the stranger's request poisoned")
    for connection in (client, stranger):
        connection.process_data_events(0.5)  # holds the window open: no answer may reach the stranger
        connection.close()
    admin.close()
    assert answers == [("client", "client")]
    (props,) = poisoned
    assert props.correlation_id == "stranger"
    assert "not through the pool's request exchange" in props.headers[protocol.POISON_REASON_HEADER]
