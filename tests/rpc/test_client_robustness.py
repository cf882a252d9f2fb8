"""One shared RpcClient against the real RabbitMQ: bad calls fail alone, reconnects stay fast,
an unclosed client is reclaimed, and close() races neither hang a future nor deadlock."""

from __future__ import annotations

import contextlib
import gc
import statistics
import threading
import time
import weakref
from concurrent.futures import Future
from urllib.parse import quote

import pytest

from switchyard.core.errors import InvalidNameError
from switchyard.rpc import protocol
from switchyard.rpc.client import RpcClient
from switchyard.rpc.control.management import ManagementApi
from switchyard.rpc.errors import CallTimeoutError, ClientClosedError, ClientThreadError
from tests.conftest import blocked_in, unique, wait_for
from tests.rpc.test_rpc import SLEEPY, H, bind

MAX_KEY = "k" * protocol.MAX_KEY_BYTES

BAD_CALLS = {
    "float header": ({"key": "k", "body": b"x", "headers": {"x-weight": 0.5}}, ValueError, "encoded"),
    "dict body": ({"key": "k", "body": {"a": 1}}, TypeError, "bytes or str"),
    "200 kB key": ({"key": "k" * 200_000, "body": b"x"}, InvalidNameError, "longer than"),
    "key past the limit": ({"key": MAX_KEY + "k", "body": b"x"}, InvalidNameError, "longer than"),
    "NUL in key": ({"key": "a\x00b", "body": b"x"}, InvalidNameError, "NUL"),
    "non-string key": ({"key": 42, "body": b"x"}, InvalidNameError, "string"),
    "200 kB header": ({"key": "k", "body": b"x", "headers": {"big": "v" * 200_000}}, ValueError, "frame"),
    "header name too long": ({"key": "k", "body": b"x", "headers": {"h" * 300: 1}}, ValueError, "encoded"),
    "fractional expiration": ({"key": "k", "body": b"x", "expiration_ms": 1.5}, ValueError, "expiration"),
    "infinite timeout": ({"key": "k", "body": b"x", "timeout": float("inf")}, ValueError, "timeout"),
}


def test_each_bad_call_fails_alone_and_the_shared_client_goes_on(pool, workers) -> None:
    name, settings = pool
    bind(name, settings, "k", MAX_KEY)
    workers.start(name, "k", SLEEPY, SLEEPY_SECONDS="0.3")
    workers.start(name, MAX_KEY, f"{H}:whoami")
    workers.wait_consuming(settings, protocol.request_queue(name, "k"), timeout=60)
    workers.wait_consuming(settings, protocol.request_queue(name, MAX_KEY), timeout=60)
    with RpcClient(name, settings, timeout=15) as client:
        for label, (kwargs, error, message) in BAD_CALLS.items():
            in_flight = client.submit("k", f"before {label}")
            with pytest.raises(error, match=message):
                client.submit(**kwargs)
            assert in_flight.result(15).text() == f"before {label}", label
            assert client.call("k", f"after {label}").text() == f"after {label}", label
        assert client.in_flight == 0  # no bad call kept a slot
        # The longest key the protocol carries goes end to end.
        assert client.call(MAX_KEY, "max").text().endswith(f"|{MAX_KEY}|max")
        assert client.stats.responses == 2 * len(BAD_CALLS) + 1


def _kill_connection(settings, connection_name: str) -> None:
    """Close a client's connection from the broker's side (management API), as a failover would."""
    api = ManagementApi(settings.connections.management_url)

    def find() -> str | None:
        for conn in api._request("GET", "/connections").json():
            if conn.get("client_properties", {}).get("connection_name") == connection_name:
                return conn["name"]
        return None

    broker_name = wait_for(find, timeout=20, interval=0.2, what="the client's connection in the API")
    api._request("DELETE", f"/connections/{quote(broker_name, safe='')}")


def test_calls_after_a_reconnect_are_not_delayed(pool, workers) -> None:
    """A wake lost with the old connection once left every later call waiting for the loop's poll."""
    name, settings = pool
    bind(name, settings, "k")
    workers.start(name, "k", f"{H}:whoami")
    workers.wait_consuming(settings, protocol.request_queue(name, "k"), timeout=60)
    connection_name = unique("reconnecting-client")
    with RpcClient(name, settings, timeout=5, name=connection_name) as client:
        client.call("k", "warm")
        stop = threading.Event()

        def hammer() -> None:  # submits throughout the outage, so wakes hit the lost connection
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    client.submit("k", "hammer", timeout=2)
                time.sleep(0.002)  # pace: a steady stream of submits

        thread = threading.Thread(target=hammer)
        published = client.stats.published
        thread.start()
        try:
            wait_for(lambda: client.stats.published > published + 10, interval=0.01,
                     what="the hammer submitting")
            _kill_connection(settings, connection_name)
            wait_for(lambda: client.stats.responses > 0 and _call_ok(client), timeout=20,
                     what="the client answering again after the reconnect")
        finally:
            stop.set()
            thread.join(10)
        wait_for(lambda: client.in_flight == 0, timeout=10, what="the hammer's calls to finish")
        latencies = []
        for i in range(30):
            started = time.perf_counter()
            client.call("k", str(i))
            latencies.append(time.perf_counter() - started)
    assert statistics.median(latencies) < 0.06, latencies  # not the I/O loop's 0.2 s poll


def _call_ok(client: RpcClient) -> bool:
    try:
        return client.call("k", "probe", timeout=2).ok
    except Exception:
        return False


def _reply_queue_exists(settings, queue: str) -> bool:
    return ManagementApi(settings.connections.management_url).get_queue(queue) is not None


def test_a_client_never_closed_is_reclaimed(pool) -> None:
    name, settings = pool
    bind(name, settings, "nobody")

    def use_and_forget() -> tuple[weakref.ref, threading.Thread, str]:
        client = RpcClient(name, settings, timeout=5)
        with pytest.raises(CallTimeoutError):
            client.call("nobody", "x", timeout=0.2)
        done: Future = client.submit("nobody", "y", timeout=0.2)
        done.add_done_callback(lambda f: f.exception())  # a callback that does not hold the client
        wait_for(done.done, timeout=5, what="the second call to time out")
        assert _reply_queue_exists(settings, client._core._reply_queue)
        return weakref.ref(client), client._core._thread, client._core._reply_queue

    ref, thread, reply_queue = use_and_forget()
    gc.collect()
    assert ref() is None, "the client is still referenced (by its own I/O thread?)"
    thread.join(10)
    assert not thread.is_alive()
    wait_for(lambda: not _reply_queue_exists(settings, reply_queue), timeout=10,
             what="the reply queue to go with the connection")


def test_a_submit_waiting_for_a_slot_when_close_comes_fails_instead_of_hanging(pool) -> None:
    name, settings = pool
    bind(name, settings, "nobody")
    client = RpcClient(name, settings, concurrency=1, timeout=30)
    first = client.submit("nobody", "holds the only slot")
    outcome: list[object] = []

    def waiter() -> None:
        try:
            outcome.append(client.submit("nobody", "waits for a slot", timeout=20))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_for(lambda: blocked_in(thread, "acquire", "wait"), interval=0.01,
             what="the waiter blocked in the slot table")
    client.close()
    thread.join(5)
    assert isinstance(first.exception(5), ClientClosedError)
    assert len(outcome) == 1
    got = outcome[0]
    if isinstance(got, Future):  # a future is fine, if it completes
        got = got.exception(3)
    assert isinstance(got, ClientClosedError), got


def test_submits_racing_close_all_complete(pool) -> None:
    name, settings = pool
    bind(name, settings, "nobody")
    def submitter(client: RpcClient, go: threading.Event, futures: list[Future]) -> None:
        go.wait()
        for _ in range(200):
            with contextlib.suppress(Exception):
                futures.append(client.submit("nobody", "x", timeout=0.5))

    for _ in range(5):
        client = RpcClient(name, settings, concurrency=4, timeout=30)
        futures: list[Future] = []
        go = threading.Event()
        threads = [threading.Thread(target=submitter, args=(client, go, futures)) for _ in range(4)]
        for t in threads:
            t.start()
        go.set()
        wait_for(lambda: futures, interval=0.001, what="submits under way")  # noqa: B023 - then close races
        client.close()
        for t in threads:
            t.join(30)
        for future in futures:
            future.exception(3)  # raises TimeoutError if a future never completes


def test_close_from_a_done_callback_neither_deadlocks_nor_raises(pool) -> None:
    name, settings = pool
    bind(name, settings, "nobody")
    client = RpcClient(name, settings, timeout=5)
    closed = threading.Event()
    errors: list[BaseException] = []

    def close_client(_future: Future) -> None:
        try:
            client.close()
        except BaseException as exc:
            errors.append(exc)
        closed.set()

    client.submit("nobody", "x", timeout=0.2).add_done_callback(close_client)
    assert closed.wait(5), "close() from the done-callback never returned"
    assert errors == []
    client._core._thread.join(5)
    assert not client._core._thread.is_alive()
    with pytest.raises(ClientClosedError):
        client.submit("nobody", "after close")


def test_call_from_a_done_callback_raises_at_once_and_the_client_goes_on(pool) -> None:
    """A done-callback runs on the thread that drives the connection: a blocking call() there waited
    for a response only that thread could take in, so it hung the client until the call's timeout."""
    name, settings = pool
    bind(name, settings, "nobody")
    client = RpcClient(name, settings, timeout=5)
    try:
        raised: list[BaseException | None] = []
        took: list[float] = []
        done = threading.Event()

        def call_inside(_future: Future) -> None:
            started = time.monotonic()
            try:
                client.call("nobody", "inner", timeout=3)
                raised.append(None)
            except BaseException as exc:
                raised.append(exc)
            took.append(time.monotonic() - started)
            done.set()

        client.submit("nobody", "x", timeout=0.2).add_done_callback(call_inside)
        assert done.wait(10)
        assert isinstance(raised[0], ClientThreadError) and took[0] < 0.5, (raised, took)
        with pytest.raises(CallTimeoutError):  # the client still serves its other callers
            client.call("nobody", "after", timeout=0.3)
    finally:
        client.close()
