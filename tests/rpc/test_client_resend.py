"""A connection that dies with calls in flight fails no caller whose call can still be sent again:
the client reconnects (to another node of a cluster) and re-sends, within each call's deadline;
past it, the call fails with the retryable ``CallInterruptedError``.

The first test shuts the client's socket down (any broker: the 3.10 and 4.0 suites); the others
SIGKILL a node of the three-node cluster (tests/rpc/cluster.py) and start it again, so the cluster
is left with three running nodes.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import replace

import pytest

from switchyard.rpc import protocol
from switchyard.rpc.client import Response, RpcClient
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.errors import CallInterruptedError
from switchyard.rpc.settings import RpcSettings
from tests.conftest import unique, wait_for
from tests.rpc import cluster
from tests.rpc.conftest import WorkerProcesses, delete_pool
from tests.rpc.test_rpc import SLEEPY, bind

CALLS = 12


def _in_flight(client: RpcClient, calls: int = CALLS, timeout: float = 30) -> list[Future[Response]]:
    """``calls`` calls submitted at once, after the first of them is answered (so the one worker
    holds one, and the others wait in its queue or are on their way)."""
    futures = [client.submit("k", f"call {n}", timeout=timeout) for n in range(calls)]
    wait_for(lambda: futures[0].done(), timeout=timeout, interval=0.01, what="the first answer")
    return futures


def _all_answered(client: RpcClient, futures: list[Future[Response]], timeout: float = 60) -> None:
    texts = [future.result(timeout).text() for future in futures]
    assert texts == [f"call {n}" for n in range(len(futures))]
    assert client.stats.resent > 0 and client.stats.interrupted == 0, client.stats


def _drop_socket(client: RpcClient) -> None:
    """Shut the client's TCP connection down under it, as a broker node's crash does: its loop reads
    the end of the stream, the broker deletes its reply queue."""
    connection = client._core._connection
    assert connection is not None
    connection._impl._transport._sock.shutdown(socket.SHUT_RDWR)


def test_calls_in_flight_on_a_connection_that_dies_are_sent_again(pool, workers) -> None:
    """Before: every call in flight failed with BrokerUnavailableError ("connection lost")."""
    name, settings = pool
    bind(name, settings, "k")
    workers.start(name, "k", SLEEPY, SLEEPY_SECONDS="0.1")
    workers.wait_consuming(settings, protocol.request_queue(name, "k"), timeout=60)
    for confirm in (False, True):
        with RpcClient(name, settings, confirm=confirm) as client:
            futures = _in_flight(client)
            _drop_socket(client)
            _all_answered(client, futures)


@pytest.fixture(scope="module")
def on_cluster() -> Iterator[None]:
    cluster.ensure_running()
    yield
    cluster.ensure_running()


@pytest.fixture
def cluster_pool(on_cluster: None) -> Iterator[tuple[str, RpcSettings]]:
    """A pool declared on the cluster through node 1 (its queues' leaders there), settings whose
    AMQP URL lists the three nodes; node 1 answers the management API."""
    settings = replace(RpcSettings.from_env(), connections=cluster.connections(cluster.node_url(1)))
    pool = unique("t")
    with PoolTopology(pool, settings) as topology:
        topology.declare()
    yield pool, replace(settings, connections=cluster.connections(cluster.urls()))
    cluster.ensure_running()  # a test that failed midway may have left a node down
    delete_pool(settings, pool)


def _serve(pool: str, workers: WorkerProcesses, node: int) -> None:
    """One slow echo worker, connected to ``node`` only (it survives the node the test kills)."""
    settings = replace(RpcSettings.from_env(), connections=cluster.connections(cluster.node_url(node)))
    bind(pool, settings, "k")
    workers.start(pool, "k", SLEEPY, SLEEPY_SECONDS="0.1", SWITCHYARD_AMQP_URL=cluster.node_url(node))
    workers.wait_consuming(settings, protocol.request_queue(pool, "k"), timeout=60)


def test_a_killed_node_fails_no_call_in_flight_on_it(cluster_pool, workers) -> None:
    """The node the client is connected to is SIGKILLed with calls in flight: the client connects
    to another node and re-sends them; each gets its answer. Before: each failed with
    BrokerUnavailableError (the issue's "one in flight on the killed connection, one handled whose
    answer was lost")."""
    name, settings = cluster_pool
    with RpcClient(name, settings) as client:
        node = cluster.client_node(client)
        _serve(name, workers, next(n for n in cluster.NODES if n != node))
        futures = _in_flight(client)
        cluster.kill(node)
        try:
            _all_answered(client, futures)
            assert cluster.client_node(client) != node
        finally:
            cluster.start_node(node)


def test_a_call_no_node_can_take_before_its_deadline_fails_retryable_after_it(cluster_pool) -> None:
    """A client given one node only, killed with calls waiting for a worker: nothing can re-send
    them, and each fails with CallInterruptedError once its deadline passes, not before. Before:
    each failed at once with BrokerUnavailableError."""
    name, settings = cluster_pool
    settings = replace(settings, connections=cluster.connections(cluster.node_url(3)))
    timeout = 3.0
    with RpcClient(name, settings) as client:
        bind(name, settings, "k")  # no worker: the calls wait in the queue
        started = time.monotonic()
        futures = [client.submit("k", f"call {n}", timeout=timeout) for n in range(CALLS)]
        cluster.kill(3)
        try:
            for future in futures:
                with pytest.raises(CallInterruptedError, match="none could re-send it"):
                    future.result(timeout + 10)
            assert time.monotonic() - started >= timeout
            assert client.stats.interrupted == CALLS
        finally:
            cluster.start_node(3)
