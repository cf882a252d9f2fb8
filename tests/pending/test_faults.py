"""Faults, on a private redis-server (the shared one is never flushed or cut): dead processors and
callers (SIGKILL), Redis connections cut by a TCP proxy, Redis losing its data, and a crash
injected between any two steps."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from switchyard.pending import (
    DataLossError,
    Delivery,
    PendingQueue,
    PendingRequest,
    PendingSettings,
    ProcessorLostError,
    StoreUnavailableError,
)
from tests.conftest import subprocess_env, wait_for
from tests.pending.conftest import PrivateRedis, keys_without_ttl, ownerless_requests, private_settings
from tests.pending.proc import CRASH_EXIT
from tests.pending.tcp_proxy import CuttableProxy


def env_for(settings: PendingSettings) -> dict[str, str]:
    """The settings as the SWITCHYARD_* variables a subprocess node reads."""
    s = settings
    return subprocess_env(
        SWITCHYARD_REDIS_URL=s.connections.redis_url,
        SWITCHYARD_REDIS_CLUSTER="1" if s.connections.redis_cluster else "0",
        SWITCHYARD_REDIS_TIMEOUT_S=str(s.connections.redis_timeout_s),
        SWITCHYARD_PENDING_PREFIX=s.prefix, SWITCHYARD_PENDING_PICKUP_TIMEOUT_S=str(s.pickup_timeout_s),
        SWITCHYARD_PENDING_HEARTBEAT_INTERVAL_S=str(s.heartbeat_interval_s),
        SWITCHYARD_PENDING_HEARTBEAT_INITIAL_DELAY_S=str(s.heartbeat_initial_delay_s),
        SWITCHYARD_PENDING_SENDER_TIMEOUT_S=str(s.sender_timeout_s),
        SWITCHYARD_PENDING_PROCESSOR_TIMEOUT_S=str(s.processor_timeout_s),
        SWITCHYARD_PENDING_DATA_LOSS_CHECK_S=str(s.data_loss_check_s),
        SWITCHYARD_PENDING_RETRY_INTERVAL_S=str(s.retry_interval_s),
        POWERTOOLS_METRICS_DISABLED="true",  # stdout carries the node's JSON lines only
    )


@contextmanager
def node_process(settings: PendingSettings, *args: str) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.pending.proc", *args], env=env_for(settings),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert "ready" in json.loads(proc.stdout.readline() or "{}"), "the node process did not start"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def lines(proc: subprocess.Popen) -> list[dict]:
    out, _ = proc.communicate(timeout=30)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@contextmanager
def nodes(settings: PendingSettings, count: int) -> Iterator[list[PendingQueue]]:
    started = [PendingQueue(settings).start() for _ in range(count)]
    try:
        yield started
    finally:
        for node in started:
            node.close()


def state_of(node: PendingQueue, endpoint: str) -> list[bytes]:
    return [node.client.hget(k, "s") for k in node.client.scan_iter(match=f"{node.key_tag(endpoint)}:r:*")]


def test_processor_dies_after_the_claim_caller_gets_a_clear_error_within_the_timeout(
        private_redis: PrivateRedis) -> None:
    """Killed after its node claimed the request (its heartbeats stop): the caller is told, since
    the processor may have done the work."""
    settings = private_settings(private_redis)
    with nodes(settings, 1) as [caller], \
            node_process(settings, "processor", "ep", "--hold", "60") as processor:
        errors: list[Exception] = []
        thread = threading.Thread(target=lambda: _record(errors, caller.queue_and_wait, "ep", 1))
        thread.start()
        wait_for(lambda: processor.stdout.readline(), timeout=10, what="the processor to take the request")
        wait_for(lambda: state_of(caller, "ep") == [b"t"], timeout=5, what="the claim")
        processor.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert processor.wait(5) and state_of(caller, "ep") == [b"t"]
        thread.join(10)
        elapsed = time.monotonic() - killed
    assert isinstance(errors[0], ProcessorLostError), errors
    assert "presumed offline" in str(errors[0])
    # processor timeout 1 s + one heartbeat interval (0.2 s) + scheduling slack
    assert elapsed < settings.processor_timeout_s + 3, elapsed


def test_node_dies_between_pop_and_claim_the_request_goes_to_another(private_redis: PrivateRedis) -> None:
    """Killed right after the pop, before the claim (a node SIGKILLed mid long poll never handed
    the request over): after the processor timeout the caller's beat puts it back in the queue,
    and a live node answers it, long before the pickup timeout (5 s) would have run out."""
    settings = private_settings(private_redis)
    # A processor whose first heartbeat (the claim) comes after CLAIM_DELAY_S, not FAST's 0.1 s
    with nodes(settings, 2) as [caller, live], \
            node_process(replace(settings, heartbeat_initial_delay_s=5.0), "processor", "ep",
                         "--hold", "60") as processor:
        outcome: list[object] = []
        thread = threading.Thread(target=lambda: _record(outcome, caller.queue_and_wait, "ep", 1))
        thread.start()
        wait_for(lambda: processor.stdout.readline(), timeout=10, what="the processor to take the request")
        processor.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert processor.wait(5) and state_of(caller, "ep") == [b"q"]
        request = live.dequeue("ep", settings.processor_timeout_s + 3)
        assert request is not None, "the popped request never came back"
        assert live.apply_response(request, "from the live node") is Delivery.DELIVERED
        thread.join(10)
        elapsed = time.monotonic() - killed
    assert getattr(outcome[0], "body", outcome[0]) == "from the live node"
    assert elapsed < settings.processor_timeout_s + 3, elapsed
    assert keys_without_ttl(private_redis.client(), settings.prefix) == []


def test_caller_dies_processor_work_is_cancelled(private_redis: PrivateRedis) -> None:
    settings = private_settings(private_redis)
    with nodes(settings, 1) as [service], node_process(settings, "caller", "ep") as caller:
        request = service.dequeue("ep", 10)
        assert request is not None
        caller.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert request.cancel.wait(settings.sender_timeout_s + 3), "the processor's work was not cancelled"
        assert "presumed gone" in (request.cancel.reason or "")
        assert time.monotonic() - killed < settings.sender_timeout_s + 3
        assert service.apply_response(request, "nobody is listening") is Delivery.ABANDONED
        assert service.status() == {}


@pytest.mark.parametrize("api", ["dequeue", "serve"])
def test_redis_cut_for_5_s_mid_calls_every_call_completes(private_redis: PrivateRedis, api: str) -> None:
    """Through the serve loop and through dequeue + apply_response: every call completes."""
    proxy = CuttableProxy(private_redis.port)
    settings = private_settings(private_redis, url=proxy.url, retry_window_s=30.0, retry_interval_s=0.5,
                                heartbeat_initial_delay_s=7.0, heartbeat_interval_s=15.0,
                                sender_timeout_s=90.0, processor_timeout_s=60.0, pickup_timeout_s=60.0,
                                data_loss_check_s=60.0)
    try:
        with nodes(settings, 2) as [caller, service]:
            stop = threading.Event()

            def handle(request: PendingRequest) -> dict:
                time.sleep(0.3)
                return {"echo": request.body}

            def serve() -> None:
                if api == "serve":
                    service.serve("ep", handle, stop)
                while not stop.is_set():
                    request = service.dequeue("ep", 1)
                    if request is not None:
                        service.apply_response(request, handle(request))

            for _ in range(4):
                threading.Thread(target=serve, daemon=True).start()
            threading.Timer(0.5, proxy.cut, args=(5.0,)).start()
            started = time.monotonic()
            with ThreadPoolExecutor(16) as pool:
                bodies = list(pool.map(lambda n: caller.queue_and_wait("ep", n).body, range(48)))
            stop.set()
            elapsed = time.monotonic() - started
    finally:
        proxy.close()
    assert proxy.cuts == 1
    assert bodies == [{"echo": n} for n in range(48)]
    assert elapsed > 5, "the cut did not happen during the calls"


def test_redis_flush_fails_in_flight_calls_with_data_loss_then_new_calls_work(
        private_redis: PrivateRedis) -> None:
    settings = private_settings(private_redis)
    with nodes(settings, 2) as [caller, service]:
        errors: list[Exception] = []
        thread = threading.Thread(target=lambda: _record(errors, caller.queue_and_wait, "ep", 1))
        thread.start()
        request = service.dequeue("ep", 10)
        assert request is not None
        private_redis.client().flushall()
        flushed = time.monotonic()
        thread.join(10)
        assert isinstance(errors[0], DataLossError), errors
        assert time.monotonic() - flushed < 3
        assert request.cancel.wait(3) and "lost its data" in (request.cancel.reason or "")
        assert service.apply_response(request, "too late") is Delivery.GONE
        assert caller.data_loss_events == 1
        # new calls work after the loss
        threading.Thread(target=lambda: service.apply_response(service.dequeue("ep", 10), "fresh"),
                         daemon=True).start()
        assert caller.queue_and_wait("ep", 2).body == "fresh"


# (role that crashes, step, what the surviving side sees, request states left behind)
CRASHES = [
    ("caller", "before_enqueue", None, []),
    ("caller", "enqueued", None, [b"a"]),  # answered, never collected: expires with its TTL
    ("caller", "before_collect", None, [b"a"]),
    ("caller", "collected", None, None),  # answered; unlinked or not yet (the reaper's batch)
    ("caller", "withdraw_timeout", None, []),
    # popped, never claimed: back in the queue after the processor timeout; nobody else serves, so
    # the (restarted) pickup timeout withdraws it; the dead take key expires with its TTL
    ("processor", "taken", "PickupTimeoutError", []),
    ("processor", "responded", "response", []),
    ("server", "taken", "PickupTimeoutError", []),  # PendingQueue.serve: the same two points
    ("server", "responded", "response", []),
]


@pytest.mark.parametrize("role,step,survivor_sees,left", CRASHES, ids=[f"{c[0]}-{c[1]}" for c in CRASHES])
def test_crash_between_steps_leaves_no_key_without_ttl_and_no_ownerless_request(
        private_redis: PrivateRedis, role: str, step: str, survivor_sees: str | None,
        left: list[bytes] | None) -> None:
    settings = private_settings(private_redis)
    client = private_redis.client()
    if role == "caller":
        caller_args = ["caller", "ep", "--crash-at", step]
        if step == "withdraw_timeout":
            caller_args += ["--pickup-timeout", "0.3"]  # nobody serves: the caller takes it back
            with node_process(settings, *caller_args) as caller:
                assert caller.wait(20) == CRASH_EXIT
        else:
            with nodes(replace(settings, sender_timeout_s=30.0), 1) as [service], \
                    node_process(settings, *caller_args) as caller:
                request = service.dequeue("ep", 3)
                if request is not None:
                    service.apply_response(request, "answer")
                assert caller.wait(20) == CRASH_EXIT
                assert (request is None) == (step == "before_enqueue")
    else:
        with nodes(settings, 1) as [caller], \
                node_process(settings, role, "ep", "--crash-at", step) as processor:
            outcome: list[object] = []
            _record(outcome, caller.queue_and_wait, "ep", 1)
            assert processor.wait(20) == CRASH_EXIT
        seen = outcome[0]
        if survivor_sees == "response":
            assert getattr(seen, "body", None) == {"answered_by": processor.pid}
        else:
            assert type(seen).__name__ == survivor_sees, seen
    states = [client.hget(k, "s") for k in client.scan_iter(match=f"{settings.prefix}:{{ep}}:r:*")]
    assert left is None or states == left
    assert keys_without_ttl(client, settings.prefix) == []
    assert ownerless_requests(client, settings.prefix) == []


def test_the_invariant_checks_catch_violations(private_redis: PrivateRedis) -> None:
    """The two checks above can fail: a key without TTL and a queued request missing from its list."""
    client, prefix = private_redis.client(), private_settings(private_redis).prefix
    client.hset(f"{prefix}:{{ep}}:r:{'a' * 32}", mapping={"s": "q"})
    client.hset(f"{prefix}:{{ep}}:r:{'b' * 32}", mapping={"s": "t"})
    assert len(keys_without_ttl(client, prefix)) == 2
    assert len(ownerless_requests(client, prefix)) == 2
    client.delete(f"{prefix}:{{ep}}:r:{'a' * 32}", f"{prefix}:{{ep}}:r:{'b' * 32}")


def _record(into: list, fn, *args, **kwargs) -> None:
    try:
        into.append(fn(*args, **kwargs))
    except Exception as exc:
        into.append(exc)


def test_a_guard_that_merely_expired_is_not_data_loss(private_redis: PrivateRedis) -> None:
    """A node frozen longer than the guard's TTL (a Lambda environment) finds it expired: no alarm."""
    settings = private_settings(private_redis, data_loss_guard_ttl_s=1.5, data_loss_check_s=60.0)
    with nodes(settings, 1) as [node]:
        time.sleep(1.7)
        assert node.check_data_loss() is False
        private_redis.client().flushall()  # a real loss within the TTL is still seen
        assert node.check_data_loss() is True
        assert node.data_loss_events == 1


def test_a_call_while_redis_is_gone_fails_after_the_retry_window(tmp_path: Path) -> None:
    """Redis gone for longer than the retry window: the call fails with StoreUnavailableError
    once its enqueue has been retried for the window, not after its pickup timeout (30 s here)."""
    server = PrivateRedis(tmp_path)  # its own: this test stops it
    server.start()
    settings = private_settings(server, retry_window_s=1.0, retry_interval_s=0.2,
                                pickup_timeout_s=30.0, heartbeat_initial_delay_s=30.0)
    try:
        with nodes(settings, 1) as [caller]:
            server.stop()
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match="unreachable"):
                caller.queue_and_wait("ep", 1)
            assert time.monotonic() - started < 10, "the call waited for something else"
    finally:
        server.stop()
