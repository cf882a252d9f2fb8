"""The pending request queue on the real (shared) Redis: caller on node A, processor on node B."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from switchyard.core.redis_client import RedisClient
from switchyard.pending import (
    CancelledError,
    CancelToken,
    Delivery,
    MessageTooLargeError,
    PendingQueue,
    PendingSettings,
    PickupTimeoutError,
    ProcessorBeat,
    RemoteError,
)
from switchyard.pending.streams import LocalDirectoryStore
from tests.conftest import blocked_in, wait_for
from tests.pending.conftest import (
    NodeFactory,
    PrivateRedis,
    keys_without_ttl,
    ownerless_requests,
    private_settings,
)


def serve(node: PendingQueue, endpoint: str, handler: Callable[[Any], Any],
          pollers: int = 1, api: str = "serve") -> threading.Event:
    """Process ``endpoint``'s requests on ``node`` in background threads until the event is set:
    with ``PendingQueue.serve``, or (``api="dequeue"``) a loop of dequeue and apply_response."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            request = node.dequeue(endpoint, 0.5)
            if request is not None:
                node.apply_response(request, handler(request.body))

    def serving() -> None:
        node.serve(endpoint, lambda request: handler(request.body), stop)

    for _ in range(pollers):
        threading.Thread(target=serving if api == "serve" else loop, daemon=True).start()
    return stop


@pytest.mark.parametrize("api", ["serve", "dequeue"])
def test_cross_node_call(make_node: NodeFactory, shared_redis: RedisClient,
                         settings: PendingSettings, api: str) -> None:
    caller, service_node = make_node(), make_node()
    stop = serve(service_node, "svc", lambda body: {"echo": body, "node": service_node.node_id}, api=api)
    try:
        token = CancelToken()  # one token may serve many calls; each lets go of it when it ends
        response = caller.queue_and_wait("svc", {"n": 1}, cancel=token)
        assert response.body == {"echo": {"n": 1}, "node": service_node.node_id}
        assert response.streams == []
        assert token._callbacks == []
    finally:
        stop.set()
    wait_for(lambda: caller.status() == {}, what="the answered state to be unlinked (off the call's path)")
    assert keys_without_ttl(shared_redis, settings.prefix) == []


def test_fast_call_is_two_writes_two_scripts_two_pops_eighteen_commands(private_redis: PrivateRedis) -> None:
    """The fast-RPC shortcut and a call's cost in Redis, as Redis counts it (INFO commandstats, the
    commands inside scripts too): the caller's enqueue script with its BLPOP for the response, the
    service's respond script (which also claims: no claiming heartbeat, nothing periodic before
    the initial delay) with its next pop; 18 commands in all (the raw lists' LPUSH, BRPOP each
    way: 4), no pub/sub message."""
    calls = 50
    settings = private_settings(private_redis, heartbeat_initial_delay_s=7.0, data_loss_check_s=3600.0)
    with PendingQueue(settings) as caller, PendingQueue(settings) as service_node:
        stop = serve(service_node, "cost", lambda body: body)
        assert caller.queue_and_wait("cost", -1).body == -1  # subscribed, scripts loaded
        client = private_redis.client()
        client.config_resetstat()
        assert [caller.queue_and_wait("cost", i).body for i in range(calls)] == list(range(calls))
        stats = client.info("commandstats")
        stop.set()
    counts = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()
              if name != "cmdstat_config|resetstat"}
    assert counts["evalsha"] == 2 * calls, counts
    assert counts["blpop"] == calls, counts  # each caller waits on its answer list ...
    assert "publish" not in counts, counts  # ... so no response goes over pub/sub
    assert counts["blmove"] <= calls + 1, counts  # (+ the pop waiting for the next request)
    # Off the call's path, so not per call: the connections' health-check PINGs (more of them when
    # a loaded machine leaves a connection idle past its check interval) and the reaper's UNLINK.
    background = {name: counts.pop(name, 0) for name in ("ping", "unlink")}
    assert sum(background.values()) <= 10, background
    # (+ the waiting pop and its PEXPIRE, the HELLO of a connection opened during the calls)
    assert sum(counts.values()) <= 18 * calls + 3, counts


def test_calls_beyond_the_answer_waits_get_their_response_on_the_node_channel(
        private_redis: PrivateRedis) -> None:
    """With no answer-list connection free, a call waits on its node's channel (the response
    published), and a call whose answer-list wait timed out (the initial delay) gets its response
    from its first beat, then the channel: each way answers."""
    settings = private_settings(private_redis, heartbeat_initial_delay_s=0.3, data_loss_check_s=3600.0)
    with PendingQueue(settings) as caller, PendingQueue(settings) as service_node:
        stop = serve(service_node, "chan", lambda body: body)
        client = private_redis.client()
        caller.redis_store.answer_waiters = 0  # (the first call's made none yet)
        client.config_resetstat()
        assert [caller.queue_and_wait("chan", i).body for i in range(5)] == list(range(5))
        counts = {n.removeprefix("cmdstat_"): int(v["calls"]) for n, v in client.info("commandstats").items()}
        assert counts.get("blpop", 0) == 0 and counts["publish"] == 5, counts
        stop.set()
        caller.redis_store.answer_waiters = 4
        slow = serve(service_node, "slow", lambda body: time.sleep(0.6) or body)  # pace: past the 0.3 s wait
        try:
            assert caller.queue_and_wait("slow", "late").body == "late"  # wait timed out at 0.3 s
        finally:
            slow.set()
    assert keys_without_ttl(client, settings.prefix) == []


def test_service_error_reaches_the_caller(make_node: NodeFactory) -> None:
    caller, service_node = make_node(), make_node()
    def fail() -> None:
        service_node.apply_response(service_node.dequeue("svc", 5), error="disk full")

    threading.Thread(target=fail, daemon=True).start()
    with pytest.raises(RemoteError, match="disk full"):
        caller.queue_and_wait("svc", "x")


def test_pickup_timeout_takes_the_request_back(make_node: NodeFactory, shared_redis: RedisClient,
                                               settings: PendingSettings) -> None:
    caller = make_node()
    started = time.monotonic()
    with pytest.raises(PickupTimeoutError, match="taken back"):
        caller.queue_and_wait("nobody", "x", pickup_timeout=0.5)
    assert 0.4 < time.monotonic() - started < 3
    assert caller.status() == {}  # state deleted, id removed from the pending list
    later = make_node()
    assert later.dequeue("nobody", 0.2) is None  # nobody can take it afterwards


def test_queued_request_ttl_follows_its_own_pickup_timeout(make_node: NodeFactory, shared_redis: RedisClient,
                                                          settings: PendingSettings) -> None:
    """Seed 002: a request lives its pickup timeout + 2 min, also when a call sets a longer one."""
    caller, cancel = make_node(), CancelToken()
    threading.Thread(target=_catch, args=(caller.queue_and_wait, "slowpoke", 1),
                     kwargs={"pickup_timeout": 600, "cancel": cancel}, daemon=True).start()
    try:
        # count=1000: the shared Redis may hold 100,000s of other keys (a SCAN of 10 per call is slow)
        keys = wait_for(lambda: list(shared_redis.scan_iter(match=f"{settings.prefix}:{{slowpoke}}:r:*",
                                                            count=1000)))
        ttl_s = shared_redis.pttl(keys[0]) / 1000
        assert 600 + settings.request_ttl_extra_s - 5 < ttl_s <= 600 + settings.request_ttl_extra_s
        assert 86_000 < shared_redis.pttl(caller.pending_key("slowpoke")) / 1000 <= 86_400  # list: 1 day
    finally:
        cancel.cancel()


def test_cancel_before_pickup(make_node: NodeFactory, settings: PendingSettings) -> None:
    caller = make_node()
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel, args=("user pressed stop",)).start()
    with pytest.raises(CancelledError, match=r"before pickup.*user pressed stop"):
        caller.queue_and_wait("idle", "x", cancel=cancel)
    assert caller.status() == {}
    assert make_node().dequeue("idle", 0.2) is None


def test_cancel_after_pickup_reaches_the_processor(make_node: NodeFactory, settings: PendingSettings) -> None:
    caller, service_node = make_node(), make_node()
    cancel = CancelToken()
    outcome: list[object] = []
    thread = threading.Thread(
        target=lambda: outcome.append(_catch(caller.queue_and_wait, "busy", 1, cancel=cancel)))
    thread.start()
    request = service_node.dequeue("busy", 5)
    assert request is not None
    cancel.cancel("no longer needed")
    assert request.cancel.wait(2), "the processor was not told"  # pub/sub on its node channel
    assert "cancelled" in (request.cancel.reason or "")
    thread.join(5)
    assert isinstance(outcome[0], CancelledError) and "after pickup" in str(outcome[0])
    assert service_node.apply_response(request, "late") is Delivery.CANCELLED
    assert caller.status() == {}


def test_cancellation_seen_by_heartbeat_when_the_message_is_missed(make_node: NodeFactory) -> None:
    """Pub/sub may lose the cancel message: the processor's heartbeat finds the flag anyway."""
    caller, service_node = make_node(), make_node()
    service_node._on_message = lambda message: None  # type: ignore[method-assign]  # deaf node
    cancel = CancelToken()
    threading.Thread(target=_catch, args=(caller.queue_and_wait, "deaf", 1), kwargs={"cancel": cancel},
                     daemon=True).start()
    request = service_node.dequeue("deaf", 5)
    assert request is not None
    cancel.cancel("stop")
    assert request.cancel.wait(3), "the heartbeat did not see the cancellation"


def test_response_found_by_heartbeat_when_the_message_is_missed(make_node: NodeFactory) -> None:
    caller, service_node = make_node(), make_node()
    original = caller._on_message
    caller._on_message = lambda m: None if m["type"] == "message" else original(m)  # type: ignore[method-assign]
    stop = serve(service_node, "lossy", lambda body: body * 2)
    try:
        assert caller.queue_and_wait("lossy", 21).body == 42  # via the caller's heartbeat poll
    finally:
        stop.set()


def test_message_too_large_is_refused_before_redis(make_node: NodeFactory, settings: PendingSettings,
                                                   shared_redis: RedisClient) -> None:
    caller = make_node(max_message_bytes=2048)
    with pytest.raises(MessageTooLargeError, match="streams"):
        caller.queue_and_wait("svc", "x" * 5000)
    with pytest.raises(ValueError, match="endpoint"):
        caller.queue_and_wait("bad{tag}", 1)
    with pytest.raises(ValueError, match="JSON"):
        caller.queue_and_wait("svc", {1, 2})
    assert list(shared_redis.scan_iter(match=f"{settings.prefix}:{{*", count=1000)) == []


def test_large_streams_go_through_storage_not_redis(make_node: NodeFactory, shared_redis: RedisClient,
                                                    settings: PendingSettings, tmp_path) -> None:
    store = LocalDirectoryStore(tmp_path / "streams")
    caller, service_node = make_node(), make_node()
    caller.store = service_node.store = store
    payload = bytes(range(256)) * 12_000  # 3 MB
    seen: dict[str, int] = {}

    def process() -> None:
        request = service_node.dequeue("files", 5)
        state = shared_redis.hgetall(service_node.state_key("files", request.id))
        seen["state_bytes"] = sum(len(k) + len(v) for k, v in state.items())
        data = store.read(request.streams[0])
        service_node.apply_response(request, {"size": len(data)}, streams={"reversed": data[::-1]})

    threading.Thread(target=process, daemon=True).start()
    response = caller.queue_and_wait("files", "upload", streams={"upload": payload})
    assert response.body == {"size": len(payload)}
    assert seen["state_bytes"] < 2048  # the request in Redis held a reference, not 3 MB
    assert store.read(response.streams[0]) == payload[::-1]
    assert len(list((tmp_path / "streams").iterdir())) == 1  # the request stream was deleted


def test_enqueue_claim_and_respond_are_idempotent_on_retry(make_node: NodeFactory,
                                                          shared_redis: RedisClient) -> None:
    """A retried script whose first reply was lost changes nothing (redis-py retries them)."""
    node = make_node()
    request_id = "a" * 32
    state, take = node.state_key("idem", request_id), node.take_key("idem", "t" * 32)
    keys = [state, node.pending_key("idem")]
    args = [f"{request_id} 1 {node.node_id}\n".encode() + b'{"body":1}', node.node_id, 60_000, 60_000]
    assert node.redis_store._enqueue(keys=keys, args=args) == 1
    assert node.redis_store._enqueue(keys=keys, args=args) == 0
    assert shared_redis.llen(node.pending_key("idem")) == 1
    assert node.redis_store.pop("idem", "t" * 32, time.monotonic() + 1).startswith(request_id.encode())
    assert shared_redis.pttl(take) > 0  # the popped request is in a key with a TTL
    # the processor's first heartbeat claims it; a retry is the same take's beat again
    assert node.processor_heartbeat("idem", request_id, "t" * 32) == ProcessorBeat(False)
    assert shared_redis.hget(state, "s") == b"t" and shared_redis.exists(take) == 0
    assert node.processor_heartbeat("idem", request_id, "t" * 32) == ProcessorBeat(False)
    assert node.processor_heartbeat("idem", request_id, "u" * 32).cancelled  # another take: refused
    assert node.respond("idem", request_id, "t" * 32, {"ok": True, "body": 1}) is Delivery.DELIVERED
    assert node.respond("idem", request_id, "t" * 32, {"ok": True, "body": 1}) is Delivery.DELIVERED
    assert node.respond("idem", request_id, "u" * 32, {"ok": True, "body": 1}) is Delivery.NOT_TAKER


def test_a_response_claims_a_popped_request_once(make_node: NodeFactory, shared_redis: RedisClient) -> None:
    """The lazy claim: the response of a request nobody claimed yet claims it; its retry is
    delivered again; another take's response is refused and leaves nothing behind."""
    caller, node = make_node(), make_node(heartbeat_initial_delay_s=7.0)  # claim delay: 1 s
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(caller.queue_and_wait("lazy", 1)))
    thread.start()
    request = node.dequeue("lazy", 5)  # tracked: its node would claim it after the claim delay
    assert request is not None and shared_redis.hget(node.state_key("lazy", request.id), "s") == b"q"
    assert node.respond("lazy", request.id, "u" * 32, {"ok": True, "body": 0}) is Delivery.NOT_TAKER
    assert node.apply_response(request, 2) is Delivery.DELIVERED
    assert node.respond("lazy", request.id, request.take_id, {"ok": True, "body": 2}) is Delivery.DELIVERED
    thread.join(5)
    assert getattr(outcome[0], "body", outcome[0]) == 2
    assert shared_redis.exists(node.take_key("lazy", request.take_id)) == 0


def test_a_foreign_request_id_on_a_take_leaves_its_request_there(make_node: NodeFactory,
                                                                   shared_redis: RedisClient) -> None:
    """A response or beat naming a take with another request's id (an HTTP service's mistake) is
    refused and puts the element it took out back, with the take key's TTL: the take's own
    response still claims and delivers it."""
    caller, node = make_node(), make_node(heartbeat_initial_delay_s=7.0)
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(caller.queue_and_wait("foreign", 1)))
    thread.start()
    request = node.dequeue("foreign", 5, track=False)
    assert request is not None
    take = node.take_key("foreign", request.take_id)
    assert node.respond("foreign", "f" * 32, request.take_id, {"ok": True, "body": 0}) is Delivery.GONE
    assert node.processor_heartbeat("foreign", "f" * 32, request.take_id).cancelled
    assert shared_redis.lindex(take, -1).startswith(request.id.encode()) and shared_redis.pttl(take) > 0
    assert node.apply_response(request, 2) is Delivery.DELIVERED
    thread.join(5)
    assert getattr(outcome[0], "body", outcome[0]) == 2
    assert shared_redis.exists(take) == 0


@contextlib.contextmanager
def first_pop_reply_lost(node: PendingQueue, endpoint: str,
                         then: Callable[[], None] = lambda: None) -> Iterator[list[bool]]:
    """The next pop on this thread runs in Redis, but its reply is lost (the connection breaks
    after it arrived; ``then`` runs first). Yields a list that is non-empty once that happened."""
    connection = node.redis_store._poll_connection(node.pending_key(endpoint))  # the pop uses it
    original = connection.read_response
    broken: list[bool] = []

    def read_response(*args: Any, **kwargs: Any) -> Any:
        if broken:
            return original(*args, **kwargs)
        broken.append(True)
        original(*args, **kwargs)
        then()
        connection.disconnect()
        raise redis.ConnectionError("reply lost")

    connection.read_response = read_response  # type: ignore[method-assign]
    try:
        yield broken
    finally:
        del connection.read_response


def test_a_pop_whose_reply_was_lost_finds_its_request_in_the_take_key(make_node: NodeFactory,
                                                                     shared_redis: RedisClient) -> None:
    """The BLMOVE ran in Redis but its reply never arrived (the connection broke): the retry reads
    the take key first and gets the same request, instead of popping the next one."""
    caller, node = make_node(), make_node()
    for n in range(2):  # one after the other: the first queued is request 0
        threading.Thread(target=_catch, args=(caller.queue_and_wait, "lost-reply", n), daemon=True).start()
        wait_for(lambda n=n: shared_redis.llen(node.pending_key("lost-reply")) == n + 1,
                 what=f"{n + 1} queued requests")
    with first_pop_reply_lost(node, "lost-reply") as broken:
        request = node.dequeue("lost-reply", 5)
    assert broken and request is not None and request.body == 0  # the first request, not the second
    assert shared_redis.llen(node.pending_key("lost-reply")) == 1
    assert node.apply_response(request, "ok") is Delivery.DELIVERED
    second = node.dequeue("lost-reply", 5)
    assert second is not None and second.body == 1
    node.apply_response(second, "ok")


@pytest.mark.parametrize("services,concurrent,calls,api", [
    pytest.param(100, 20, 2, "serve", id="100x20x2"),
    pytest.param(50, 10, 2, "dequeue", id="dequeue-50x10x2"),
    pytest.param(100, 20, 20, "serve", id="100x20x20", marks=[pytest.mark.slow, pytest.mark.skipif(
        not os.environ.get("SWITCHYARD_PENDING_FULL_SCALE"),
        reason="40,000 calls: set SWITCHYARD_PENDING_FULL_SCALE=1 (the default run does 100x20x2)")]),
])
def test_many_polling_services_each_response_to_its_caller(
        make_node: NodeFactory, shared_redis: RedisClient, settings: PendingSettings,
        services: int, concurrent: int, calls: int, api: str) -> None:
    """Halibut's ManyPollingTentacles shape: every caller gets the answer to its own request.

    With seed 002's timings: 2,000 callers in one test process on a shared 2-core machine can
    wait longer than the fast test timings allow."""
    seed_002 = PendingSettings()
    timings = {name: getattr(seed_002, name) for name in (
        "heartbeat_interval_s", "heartbeat_initial_delay_s", "sender_timeout_s", "processor_timeout_s",
        "pickup_timeout_s")}
    callers = [make_node(**timings) for _ in range(2)]
    service_node = make_node(**timings)
    stops = [serve(service_node, f"svc{i}", lambda body, i=i: {"svc": i, "echo": body}, pollers=4, api=api)
             for i in range(services)]

    def one_caller(index: int) -> int:
        svc, _worker = divmod(index, concurrent)
        node = callers[index % len(callers)]
        for n in range(calls):
            body = {"caller": index, "n": n}
            assert node.queue_and_wait(f"svc{svc}", body).body == {"svc": svc, "echo": body}
        return calls

    try:
        with ThreadPoolExecutor(services * concurrent) as pool:
            assert sum(pool.map(one_caller, range(services * concurrent))) == services * concurrent * calls
    finally:
        for stop in stops:
            stop.set()
    assert ownerless_requests(shared_redis, settings.prefix) == []
    wait_for(lambda: callers[0].status() == {}, what="every answered state to be unlinked")


def _catch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        return exc


def test_an_unreadable_request_is_answered_with_an_error_not_a_crash(make_node: NodeFactory) -> None:
    caller, service_node = make_node(), make_node()
    outcome: list[object] = []
    garbage = b"{not json"
    thread = threading.Thread(
        target=lambda: outcome.append(_catch(caller.caller._call, "svc", garbage, 5, None)))
    thread.start()
    assert service_node.dequeue("svc", 2) is None  # answered with an error, the poll goes on
    thread.join(5)
    assert isinstance(outcome[0], RemoteError) and "unreadable request" in str(outcome[0])


def test_a_foreign_element_in_the_pending_list_is_dropped_and_the_next_request_served(
        make_node: NodeFactory, shared_redis: RedisClient, caplog: pytest.LogCaptureFixture) -> None:
    """Something no caller wrote (no request id to answer) is logged, counted and dropped; the
    request behind it is served; the dropped element's take key expires with its TTL."""
    caller, service_node = make_node(), make_node()
    shared_redis.rpush(service_node.pending_key("foreign"), b"no header, no id")
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(_catch(caller.queue_and_wait, "foreign", 7)))
    thread.start()
    wait_for(lambda: shared_redis.llen(service_node.pending_key("foreign")) == 2, what="the real request")
    request = service_node.dequeue("foreign", 2)
    assert request is not None and request.body == 7
    service_node.apply_response(request, "served")
    thread.join(5)
    assert getattr(outcome[0], "body", outcome[0]) == "served"
    assert "dropped an unreadable element" in caplog.text
    takes = list(shared_redis.scan_iter(match=f"{service_node.key_tag('foreign')}:t:*"))
    assert len(takes) == 1 and shared_redis.pttl(takes[0]) > 0


def test_close_ends_a_poll_blocked_in_its_pop_at_once(make_node: NodeFactory) -> None:
    """A poller waits in a blocking pop on its own connection: closing the node interrupts it
    (the poll returns None) instead of leaving it blocked for the rest of its wait."""
    node = make_node()
    outcome: list[object] = []
    poller = threading.Thread(target=lambda: outcome.append(node.dequeue("closing", 20)))
    poller.start()
    wait_for(lambda: len(node.redis_store._poll_connections) == 1, what="the poller's pop connection")
    wait_for(lambda: blocked_in(poller, "dequeue", "read_response"), interval=0.01,
             what="the poller blocked in BLMOVE")
    closed_at = time.monotonic()
    node.close()
    poller.join(5)
    assert not poller.is_alive() and outcome == [None]
    assert time.monotonic() - closed_at < 3


def test_a_pop_interrupted_by_close_gives_its_request_back(make_node: NodeFactory,
                                                           shared_redis: RedisClient) -> None:
    """The node closes just as its poller's pop moved a request (the reply is lost to the
    shutdown): the request goes back to the head of the pending list, with its TTL, and
    another node serves it; nothing waits for the processor timeout."""
    caller, closing, other = make_node(), make_node(), make_node()
    outcome: list[object] = []
    call = threading.Thread(target=lambda: outcome.append(_catch(caller.queue_and_wait, "handover", 5)))
    call.start()
    with first_pop_reply_lost(closing, "handover", closing._closed.set) as broken:  # close() cuts the reply
        assert closing.dequeue("handover", 5) is None
    assert broken
    pending = closing.pending_key("handover")
    assert shared_redis.llen(pending) == 1 and shared_redis.pttl(pending) > 0
    assert list(shared_redis.scan_iter(match=f"{closing.key_tag('handover')}:t:*")) == []
    request = other.dequeue("handover", 5)
    assert request is not None and request.body == 5
    other.apply_response(request, "handed over")
    call.join(5)
    assert getattr(outcome[0], "body", outcome[0]) == "handed over"
