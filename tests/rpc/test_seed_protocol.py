"""Seed 000's protocols exactly, with no Switchyard header, against the real control plane.

A client that follows seed 000's "Client protocol" sends the key as routing key only, and a worker
that follows its worker protocol reports activity the same way. Lambda's Amazon MQ events drop the
routing key; the staging queues bring it back through ``x-death``. These tests talk plain pika.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from switchyard.rpc import protocol
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.drivers import NoopDriver
from switchyard.rpc.store import GroupStatus
from tests.conftest import subprocess_env, unique, wait_for

KEYS = ["infra=42", "voie 3 é 🚂", "timetable=7,infra=42"]
PLAIN_WORKER = Path(__file__).with_name("plain_worker.py")


class PlainClient:
    """Seed 000's client protocol: exchange ``{pool}-req-xchg``, routing key = key, correlation id,
    reply-to, mandatory. No other header."""

    def __init__(self, amqp_url: str, pool: str) -> None:
        self.pool = pool
        self.connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        self.channel = self.connection.channel()
        self.reply_queue = self.channel.queue_declare("", exclusive=True).method.queue
        self.returned: list[bytes] = []
        self.channel.add_on_return_callback(lambda _ch, _m, _p, body: self.returned.append(body))

    def send(self, key: str, body: bytes, expiration: str | None = None) -> str:
        correlation_id = uuid.uuid4().hex
        self.channel.basic_publish(
            protocol.req_exchange(self.pool), key, body,
            pika.BasicProperties(correlation_id=correlation_id, reply_to=self.reply_queue,
                                 expiration=expiration),
            mandatory=True)
        return correlation_id

    def wait(self, correlation_ids: set[str], timeout: float = 30) -> dict[str, tuple[str, bytes, float]]:
        """``correlation id -> (x-status, body, arrival time)`` once all have arrived."""
        got: dict[str, tuple[str, bytes, float]] = {}
        deadline = time.monotonic() + timeout
        while not correlation_ids <= got.keys():
            assert time.monotonic() < deadline, f"no answer for {sorted(correlation_ids - got.keys())}"
            method, props, body = self.channel.basic_get(self.reply_queue, auto_ack=True)
            if method is None:
                self.connection.sleep(0.01)
                continue
            got[props.correlation_id] = ((props.headers or {}).get(protocol.STATUS_HEADER), body,
                                         time.monotonic())
        return got

    def close(self) -> None:
        self.connection.close()


@pytest.fixture
def plain(pool) -> Iterator[tuple[str, object, PlainClient]]:
    name, settings = pool
    client = PlainClient(settings.connections.amqp_url, name)
    yield name, settings, client
    client.close()


def test_plain_client_without_headers_is_served_through_switchyard_local(plain) -> None:
    """Three new keys, one with spaces and non-ASCII: each request starts its group and is answered,
    and the worker saw the key the client meant."""
    pool, _, client = plain
    local = subprocess.Popen(
        [sys.executable, "-m", "switchyard", "local", "--pool", pool],
        env=subprocess_env(SWITCHYARD_RPC_WORKER_HANDLER="tests.rpc.handlers:whoami"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ids = {client.send(key, f"hello {key}".encode()): key for key in KEYS}
        answers = client.wait(set(ids), timeout=60)
        for correlation_id, key in ids.items():
            status, body, _ = answers[correlation_id]
            _, seen_key, seen_body = body.decode().split("|", 2)
            assert (status, seen_key, seen_body) == ("ok", key, f"hello {key}")
        assert client.returned == []
    finally:
        local.terminate()
        _, err = local.communicate(timeout=60)
        assert local.returncode == 0, err


def test_plain_worker_reports_keep_its_group_active_past_the_unbind_delay(plain, planes) -> None:
    """A worker started by hand with seed 000's environment, reporting activity by routing key only."""
    pool, settings, client = plain
    plane = planes.start(pool, settings, unbind_s=1.0, stop_s=30, interval_s=0.1, driver=NoopDriver())
    state = plane.plane.state
    key = "by hand é"
    first = client.send(key, b"wake up")  # the orphan path creates the group (no worker yet)
    wait_for(lambda: (g := state.get(key)) is not None and g.status is GroupStatus.ACTIVE,
             timeout=20, what="the group to be created")
    worker = subprocess.Popen([sys.executable, str(PLAIN_WORKER)], env=subprocess_env(
        AMQP_URL=settings.connections.amqp_url, WORKER_ID="hand-1", WORKER_KEY=key, WORKER_POOL=pool,
        WORKER_REQUESTS_QUEUE=protocol.request_queue(pool, key),
        WORKER_ACTIVITY_EXCHANGE=protocol.activity_exchange(pool)))
    try:
        assert client.wait({first}, timeout=30)[first][0] == "ok"
        generation = state.get(key).generation
        until = time.monotonic() + 3.5  # 3.5 x UNBIND_DELAY
        while time.monotonic() < until:
            sent = client.send(key, b"tick")
            assert client.wait({sent}, timeout=10)[sent][0] == "ok"
            group = state.get(key)
            assert group.status is GroupStatus.ACTIVE and group.generation == generation, group
            time.sleep(0.3)  # pace: a tick every 0.3 s, more often than UNBIND_DELAY
    finally:
        worker.terminate()
        worker.wait(10)


@pytest.mark.parametrize("with_header", [False, True], ids=["plain", "x-switchyard-key"])
def test_an_orphans_remaining_ttl_is_honoured(plain, planes, with_header: bool) -> None:
    """Sent with expiration 4 s while no control plane runs; the plane starts 2.5 s later and no
    worker ever answers: the caller hears ``expired`` about 4 s after sending, not 4 s after
    forwarding (6.5 s; the gap leaves room for a loaded machine, where CI once took 3.0 s for 2.0)."""
    pool, settings, client = plain
    key = unique("never answered")
    sent_at = time.monotonic()
    if with_header:
        correlation_id = uuid.uuid4().hex
        client.channel.basic_publish(
            protocol.req_exchange(pool), key, b"x", pika.BasicProperties(
                correlation_id=correlation_id, reply_to=client.reply_queue, expiration="4000",
                headers={protocol.KEY_HEADER: key}), mandatory=True)
    else:
        correlation_id = client.send(key, b"x", expiration="4000")
    time.sleep(2.5)  # pace: 2.5 s of its 4 s pass before any control plane runs
    planes.start(pool, settings, interval_s=0.1, driver=NoopDriver())
    status, _, arrived = client.wait({correlation_id}, timeout=10)[correlation_id]
    assert status == "expired"
    assert 3.4 <= arrived - sent_at <= 5.8, f"answered after {arrived - sent_at:.2f} s"


def test_an_orphan_whose_time_ran_out_before_forwarding_is_answered_expired_at_once(plain, planes) -> None:
    pool, settings, client = plain
    correlation_id = client.send("late", b"x", expiration="300")
    time.sleep(1.5)  # pace: its 300 ms run out before any control plane runs
    plane = planes.start(pool, settings, interval_s=0.1, driver=NoopDriver())
    status, _, _ = client.wait({correlation_id}, timeout=10)[correlation_id]
    assert status == "expired"
    assert plane.plane.state.get("late") is None, "an expired orphan must not start a group"
    with PoolTopology(pool, settings) as topology:
        assert topology.queue_status(protocol.request_queue(pool, "late")) is None
