"""``switchyard pool poison``: the set-aside requests listed, and replayed once their cause is fixed.

A plain pika client's request kills its worker until the delivery limit sets it aside; the handler
is then "fixed" (a worker that answers anything takes the key) and the replay sends the request
back: the same client gets its answer on its own reply queue. A message with no key stays."""

from __future__ import annotations

import json

import pika
import pytest

from switchyard.cli.main import main
from switchyard.rpc import protocol
from tests.conftest import wait_for
from tests.rpc.test_undecodable_headers import Producer

ECHO = "tests.rpc.handlers:control_plane_echo"  # b"crash" kills the worker
WHOAMI = "tests.rpc.handlers:whoami"


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["pool", "poison", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_poisoned_request_is_listed_then_replayed_to_its_fixed_key(make_pool, planes, workers,
                                                                     capsys) -> None:
    pool, settings = make_pool(delivery_limit=2)
    plane = planes.start(pool, settings, handler=ECHO, interval_s=0.1, worker_env={"WORKER_PREFETCH": "1"})
    producer = Producer(settings.connections.amqp_url)
    try:
        producer.request(pool, "poison", b"crash", "c-1", headers={protocol.KEY_HEADER: "poison"})
        [(props, _)] = producer.replies(1, timeout=60).values()
        assert props.headers[protocol.STATUS_HEADER] == protocol.Status.DELIVERY_LIMIT
        producer.publish("", protocol.poison_queue(pool), b"no key", pika.BasicProperties(headers={}))
        plane.stop()  # its groups stop with it

        listed = cli(capsys, "-p", pool)["messages"]
        assert sorted((m["key"], m["reason"], m["correlation_id"]) for m in listed if m["key"]) == [
            ("poison", "delivery_limit", "c-1")]
        assert [m["size"] for m in listed if m["key"] is None] == [len(b"no key")]
        assert len(cli(capsys, "-p", pool)["messages"]) == 2  # listing takes nothing

        workers.start(pool, "poison", WHOAMI)  # the fix: a handler that answers it
        workers.wait_consuming(settings, protocol.request_queue(pool, "poison"), timeout=60)
        replayed = cli(capsys, "-p", pool, "--replay")
        assert (replayed["replayed"], replayed["kept"], replayed["keys"]) == (1, 1, ["poison"])
        [(props, body)] = producer.replies(1, timeout=30).values()
        assert props.correlation_id == "c-1"
        assert props.headers[protocol.STATUS_HEADER] == protocol.Status.OK, (props.headers, body)
        # (the kept one goes back as its channel closes: on a quorum queue, a moment later)
        wait_for(lambda: [m["key"] for m in cli(capsys, "-p", pool)["messages"]] == [None],
                 what="the message without a key back in the poison queue, alone")
    finally:
        producer.close()
