"""A connection kept between uses (the control plane's publisher, the topology's) that went
half-open (the path dropped without a RST) is not alive: the broker was not heard within two
heartbeats. Before, ``is_alive`` trusted it and the next publish waited out its 30 s confirm
timeout (the fault suite's "rpc: RabbitMQ half-open": orphans stuck 30 s after the bridges came back)."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from switchyard.config import Connections
from switchyard.rpc.amqp import connect, is_alive
from tests.pending.tcp_proxy import CuttableProxy

HEARTBEAT_S = 1


def test_a_kept_connection_through_a_half_open_path_is_not_alive() -> None:
    url = urlsplit(Connections.from_env().amqp_url)
    proxy = CuttableProxy(url.port or 5672)
    connection = connect(url._replace(netloc=f"{url.netloc.rpartition('@')[0]}@{proxy.address}").geturl(),
                         "half-open-test", heartbeat=HEARTBEAT_S)
    try:
        assert is_alive(connection)
        proxy.hang(60)
        time.sleep(2 * HEARTBEAT_S + 1)
        assert not is_alive(connection)
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
