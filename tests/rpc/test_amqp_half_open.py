"""A connection kept between uses (the control plane's publisher, the topology's) that went
half-open (the path dropped without a RST) is not alive: the broker was not heard within two
heartbeats. Before, ``is_alive`` trusted it and the next publish waited out its 30 s confirm
timeout (the fault suite's "rpc: RabbitMQ half-open": orphans stuck 30 s after the bridges came back)."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pika
import pytest

from switchyard.core.config import Connections
from switchyard.rpc.amqp import connect, is_alive
from switchyard.rpc.control.publisher import ConfirmingPublisher, Outgoing
from switchyard.rpc.settings import HEARTBEAT_ENV
from tests.conftest import wait_for
from tests.pending.tcp_proxy import CuttableProxy

HEARTBEAT_S = 1


def _proxy() -> CuttableProxy:
    return CuttableProxy(urlsplit(Connections.from_env().amqp_url).port or 5672)


def test_a_kept_connection_through_a_half_open_path_is_not_alive() -> None:
    proxy = _proxy()
    connection = connect(proxy.through(Connections.from_env().amqp_url), "half-open-test",
                         heartbeat=HEARTBEAT_S)
    try:
        assert is_alive(connection)
        proxy.hang(60)
        wait_for(lambda: not is_alive(connection), timeout=2 * HEARTBEAT_S + 3, interval=0.2,
                 what="two heartbeats unheard")
    finally:
        proxy.close()


def test_an_idle_connection_to_a_live_broker_stays_alive() -> None:
    """No traffic for five heartbeats, only the I/O loop running (as a consumer's does): the
    broker's heartbeats are what is heard."""
    connection = connect(Connections.from_env().amqp_url, "idle-test", heartbeat=HEARTBEAT_S)
    try:
        end = time.monotonic() + 5 * HEARTBEAT_S
        while time.monotonic() < end:
            connection.process_data_events(time_limit=0.25)
        assert is_alive(connection)
    finally:
        connection.close()


def test_a_publisher_whose_connection_went_half_open_after_use_publishes_on_a_new_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Used, then the path goes silent; the next batch opens a new connection (new ones get
    through again after 1 s) instead of waiting on the dead one for a confirm."""
    monkeypatch.setenv(HEARTBEAT_ENV, str(HEARTBEAT_S))
    proxy = _proxy()
    publisher = ConfirmingPublisher(proxy.through(Connections.from_env().amqp_url), "half-open-publisher")
    message = Outgoing("", "switchyard-no-such-queue", b"x", pika.BasicProperties())
    try:
        assert publisher.publish_all([message]) == 1
        proxy.hang(1)
        wait_for(lambda: not is_alive(publisher._connection), timeout=2 * HEARTBEAT_S + 3, interval=0.2,
                 what="the kept connection's two heartbeats unheard")
        started = time.monotonic()
        assert publisher.publish_all([message], timeout=10) == 1
        assert time.monotonic() - started < 1.0
    finally:
        publisher.close()
        proxy.close()
