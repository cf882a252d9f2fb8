"""The worker's handler thread: long handlers keep the connection alive, shedding never poisons.

Workers run as real subprocesses against the real RabbitMQ (quorum request queues).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from switchyard.rpc import protocol
from switchyard.rpc.client import RpcClient
from switchyard.rpc.settings import HEARTBEAT_ENV
from tests.conftest import unique, wait_for
from tests.rpc.conftest import get_message, ready_count
from tests.rpc.test_rpc import H, bind

LONG_S = 60  # the long handler: twelve heartbeats, six times what the broker lets a connection be silent


@pytest.mark.slow
def test_a_one_minute_handler_is_answered_once_with_heartbeats_flowing(
        pool, workers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a 5 s heartbeat the broker drops a connection silent for ~10 s: the handler must not
    block the worker's I/O, nor the wait for its answer the client's (both heartbeat every 5 s, so a
    minute is six such silences on each side). A second worker stands by: a redelivery would start
    the request there too."""
    monkeypatch.setenv(HEARTBEAT_ENV, "5")  # the client's connection
    name, settings = pool
    bind(name, settings, "long")
    log = tmp_path / "starts.log"
    env = {"SLOW_SECONDS": str(LONG_S), "START_LOG": str(log), "WORKER_PREFETCH": "1", HEARTBEAT_ENV: "5"}
    first = workers.start(name, "long", f"{H}:slow_logged", worker_id=unique("first"), **env)
    workers.wait_consuming(settings, protocol.request_queue(name, "long"), timeout=60)
    with RpcClient(name, settings, timeout=LONG_S + 80) as client:
        future = client.submit("long", "a minute", expiration_ms=(LONG_S + 110) * 1000)
        wait_for(log.exists, timeout=60, what="the handler to start")
        workers.start(name, "long", f"{H}:slow_logged", worker_id=unique("standby"), **env)
        response = future.result(LONG_S + 90)
        assert response.ok and response.body == b"a minute"
        assert first.poll() is None, "the worker lost its connection and exited"
        time.sleep(2)  # window: a duplicate answer would arrive now
        assert client.stats.stale_responses == 0
    assert log.read_text().splitlines() == [f"{response.headers[protocol.WORKER_ID_HEADER]} a minute"]
    first.send_signal(signal.SIGTERM)
    assert first.wait(15) == 0


def test_shedding_six_times_leaves_the_request_healthy(make_pool, workers) -> None:
    """Requeue republishes instead of rejecting: the delivery limit (5) counts crashes, not sheds."""
    name, settings = make_pool(delivery_limit=5)
    bind(name, settings, "k")
    workers.start(name, "k", f"{H}:shed_until", SHED_TIMES="8")
    workers.wait_consuming(settings, protocol.request_queue(name, "k"), timeout=60)
    with RpcClient(name, settings, timeout=20) as client:
        response = client.call("k", "healthy")
    assert response.ok and response.text() == "8"  # shed 8 times, then answered
    assert get_message(settings, protocol.dl_queue(name), timeout=0.5) is None


def test_a_shed_request_keeps_its_remaining_expiration(make_pool, workers) -> None:
    """Republishing must not restart the request's clock: a request shed forever still expires."""
    name, settings = make_pool(delivery_limit=5)
    bind(name, settings, "k")
    workers.start(name, "k", f"{H}:shed_until", SHED_TIMES="1000000000")
    workers.wait_consuming(settings, protocol.request_queue(name, "k"), timeout=60)
    with RpcClient(name, settings, timeout=1) as client:
        sent = time.monotonic()
        future = client.submit("k", "shed forever", timeout=30, expiration_ms=2000)
        dead = get_message(settings, protocol.dl_queue(name), timeout=15)
        elapsed = time.monotonic() - sent
        future.cancel()
    assert dead is not None, "a request shed forever never expired"
    _, props, body = dead
    assert body == b"shed forever"
    # Shed past its deadline, it is dead-lettered (a copy with expiration 0 would be delivered
    # straight back to the waiting worker).
    assert props.headers[protocol.FIRST_DEATH_REASON_HEADER] in (protocol.Status.EXPIRED,
                                                                 protocol.Status.REJECTED)
    assert props.correlation_id and props.reply_to
    assert 1.5 < elapsed < 6, elapsed


def test_sigterm_sheds_prefetched_requests_without_counting_them(make_pool, workers, tmp_path) -> None:
    """Two-stage shutdown: the request in hand is answered, prefetched ones go back uncounted."""
    name, settings = make_pool(delivery_limit=5)
    bind(name, settings, "k")
    log = tmp_path / "starts.log"
    doomed = workers.start(name, "k", f"{H}:slow_logged", SLOW_SECONDS="1.0", START_LOG=str(log),
                           WORKER_PREFETCH="4")
    workers.wait_consuming(settings, protocol.request_queue(name, "k"), timeout=60)
    with RpcClient(name, settings, timeout=30) as client:
        futures = [client.submit("k", str(i)) for i in range(4)]
        wait_for(lambda: log.exists() and ready_count(settings, protocol.request_queue(name, "k")) == 0,
                 interval=0.02, what="the first request in hand, the others prefetched")
        doomed.send_signal(signal.SIGTERM)
        assert futures[0].result(10).body == b"0"
        assert doomed.wait(10) == 0
        assert not any(f.done() for f in futures[1:])
        workers.start(name, "k", f"{H}:whoami")
        answers = [f.result(20).text().split("|", 2)[2] for f in futures[1:]]
    assert sorted(answers) == ["1", "2", "3"]
