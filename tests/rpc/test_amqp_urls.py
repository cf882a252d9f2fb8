"""SWITCHYARD_AMQP_URL as a list of a cluster's nodes: connections spread over them, skip a dead
one, and every failure still names the setting without a password."""

from __future__ import annotations

import socket
from collections import Counter

import pytest

from switchyard.core.config import Connections
from switchyard.core.errors import BrokerUnavailableError, ConfigError
from switchyard.rpc.amqp import amqp_urls, connect, redact, url_parameters


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_of(url: str) -> int:
    connection = connect(url, "switchyard-test-urls")
    try:
        return int(connection._impl.params.port)
    finally:
        connection.close()


def test_a_list_is_split_where_a_url_begins_so_a_password_may_hold_a_comma() -> None:
    urls = "amqp://u:p,w@h1:5672/%2F, amqps://u:pw@h2:5671/v,amqp://u:pw@h3/%2F"
    assert amqp_urls(urls) == ["amqp://u:p,w@h1:5672/%2F", "amqps://u:pw@h2:5671/v", "amqp://u:pw@h3/%2F"]
    assert redact(urls) == "amqp://u:***@h1:5672/,amqp://u:***@h2:5671/,amqp://u:***@h3:5672/"
    assert url_parameters(urls).host == "h1"  # the first: its user and vhost are the list's


def test_every_url_of_a_list_is_checked_before_any_connection() -> None:
    urls = "amqp://u:secret-pw@127.0.0.1/%2F,amqp://u:secret-pw@127.0.0.1/?no_such_option=1"
    for use in (url_parameters, redact, lambda u: connect(u, "test")):
        with pytest.raises(ConfigError, match="SWITCHYARD_AMQP_URL is not an AMQP URL") as caught:
            use(urls)
        assert "no_such_option" in str(caught.value) and "secret-pw" not in str(caught.value)


def test_connections_start_at_a_random_url_and_skip_a_dead_one() -> None:
    """Three URLs of one broker (its name and its address) and a dead port: every connection lands on
    a live one, and not always the first listed (as a cluster's load balancer spreads them)."""
    live = amqp_urls(Connections.from_env().amqp_url)[0]  # one node (of a cluster's list too)
    params = url_parameters(live)
    dead = f"amqp://guest:guest@127.0.0.1:{_closed_port()}/%2F"
    by_name = live.replace("127.0.0.1", "localhost") if "127.0.0.1" in live else live
    urls = ",".join([dead, live, by_name])
    hosts: Counter[str] = Counter()
    for _ in range(40):
        connection = connect(urls, "switchyard-test-urls")
        try:
            assert connection._impl.params.port == params.port
            hosts[connection._impl.params.host] += 1
        finally:
            connection.close()
    assert len(hosts) == 2, hosts  # both live URLs taken (all 40 on one: 1 in 10 million)


def test_no_url_answering_is_one_line_naming_each_without_its_password() -> None:
    urls = ",".join(f"amqp://guest:pw-{n}@127.0.0.1:{_closed_port()}/%2F" for n in range(3))
    with pytest.raises(BrokerUnavailableError) as caught:
        connect(urls, "switchyard-test-urls")
    message = str(caught.value)
    assert "\n" not in message and "set SWITCHYARD_AMQP_URL" in message
    assert "pw-" not in message and message.count("amqp://guest:***@127.0.0.1:") == 3
