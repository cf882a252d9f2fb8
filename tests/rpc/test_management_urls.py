"""Several management URLs (one per node of a cluster): a node that cannot answer is passed over, within
bounded time, and the one that answered is used next. The dead nodes are local sockets: one refuses
connections, one accepts them and never answers."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from switchyard.core.config import Connections
from switchyard.core.errors import BrokerUnavailableError, ConfigError
from switchyard.rpc.control.management import ManagementApi, vhost_from_amqp_url
from switchyard.rpc.settings import RpcSettings


@pytest.fixture
def silent() -> Iterator[str]:
    """A management URL whose node accepts the connection (the kernel does) and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        yield f"http://guest:guest@127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def refused() -> str:
    """A management URL whose port nothing listens on."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    return f"http://guest:guest@127.0.0.1:{port}"


def test_a_dead_node_is_passed_over_and_the_answering_one_kept(silent: str, refused: str) -> None:
    good = RpcSettings.from_env().connections.management_url
    api = ManagementApi(f"{silent}, {refused},{good}", timeout=0.5)
    started = time.monotonic()
    assert api.get_queue("switchyard-no-such-queue") is None
    assert 0.5 <= time.monotonic() - started < 3  # one read timeout, one refusal, one answer
    started = time.monotonic()
    assert api.get_queue("switchyard-no-such-queue") is None
    assert time.monotonic() - started < 0.5  # straight to the node that answered


def test_every_node_down_is_one_error_naming_each_within_bounded_time(silent: str, refused: str) -> None:
    api = ManagementApi(f"{silent},{refused}", timeout=0.5)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as raised:
        api.get_queue("switchyard-no-such-queue")
    assert time.monotonic() - started < 3
    message = str(raised.value)
    assert silent.split("@")[1] in message and refused.split("@")[1] in message
    assert "guest:guest" not in message


def test_a_list_of_urls_is_checked_url_by_url_and_the_vhost_is_the_first_urls() -> None:
    nodes = "http://u:p@10.0.0.1:15672,http://u:p@10.0.0.2:15672"
    assert Connections(management_url=nodes).management_url == nodes
    with pytest.raises(ConfigError, match="SWITCHYARD_MANAGEMENT_URL"):
        _ = Connections(management_url=f"{nodes},amqp://u:p@10.0.0.3:5672").management_url
    assert vhost_from_amqp_url("amqp://u:p@a:5672/prod,amqp://u:p@b:5672/prod") == "prod"
    assert vhost_from_amqp_url("amqps://u:p@a:5671/%2F") == "/"
