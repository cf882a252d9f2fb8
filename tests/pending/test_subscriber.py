"""Who reads a node's pub/sub connection: a waiting caller (the one a message is for, when it
waits alone: no thread hand-off), the listener thread when nobody waits; a caller reading through
a cut connection still gets its lost message's worth (re-subscription, re-check); pollers wait in
a blocking pop, not on pub/sub, and one blocked through a cut takes what was queued meanwhile."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from switchyard.pending import CancelToken, Delivery, PendingQueue, PendingSettings
from tests.conftest import blocked_in, wait_for
from tests.pending.conftest import NodeFactory, PrivateRedis, keys_without_ttl, private_settings
from tests.pending.tcp_proxy import CuttableProxy
from tests.pending.test_queue import _catch, serve


def direct(settings: PendingSettings, server: PrivateRedis) -> PendingSettings:
    """The same settings (prefix too) on a straight connection to ``server``, not through a proxy."""
    return replace(settings, connections=replace(settings.connections, redis_url=server.url))


def record_dispatches(node: PendingQueue) -> list[tuple[str, str, str]]:
    """(message type, channel, name of the thread that read it) for every message ``node`` gets."""
    seen: list[tuple[str, str, str]] = []
    original = node._on_message

    def recording(message: dict[str, Any]) -> None:
        channel = message["channel"]
        seen.append((message["type"], channel.decode() if isinstance(channel, bytes) else channel,
                     threading.current_thread().name))
        original(message)

    node._on_message = recording  # type: ignore[method-assign]
    return seen


def responses(seen: list[tuple[str, str, str]], node: PendingQueue) -> list[str]:
    """The threads that read ``node``'s response messages."""
    return [thread for kind, channel, thread in seen if kind == "message" and channel == node.node_channel]


def call_one_at_a_time(caller: PendingQueue, endpoint: str, count: int) -> None:
    """``count`` calls in a row on this thread, each answered with its own body (an echo service)."""
    for n in range(count):
        assert caller.queue_and_wait(endpoint, n).body == n


def test_one_call_at_a_time_is_read_by_the_calling_thread_and_needs_no_pulse(make_node: NodeFactory) -> None:
    """No thread hand-off: the caller reads its response; the pollers' blocking pops hand them
    the requests (both serve), with no message on the service node's pub/sub at all. (Calls beyond
    the answer-list waits': none here.)"""
    caller, service_node = make_node(), make_node()
    caller.redis_store.answer_waiters = 0
    served: list[str] = []

    def echo(body: Any) -> Any:
        served.append(threading.current_thread().name)  # the poller that took the request
        return body

    stop = serve(service_node, "solo", echo, pollers=2)
    try:
        call_one_at_a_time(caller, "solo", 3)  # warm up
        at_caller, at_service = record_dispatches(caller), record_dispatches(service_node)
        del served[:]
        call_one_at_a_time(caller, "solo", 30)
    finally:
        stop.set()
    read_by_caller = responses(at_caller, caller)
    assert len(read_by_caller) == 30 and len(served) == 30
    # a shared 2-core machine may stall a thread past the listener's quiet tick now and then
    assert read_by_caller.count(threading.current_thread().name) >= 27, read_by_caller
    assert [kind for kind, _, _ in at_service if kind == "message"] == [], at_service


def test_the_listener_reads_when_nobody_waits_and_the_role_moves_between_concurrent_callers(
        make_node: NodeFactory) -> None:
    caller, service_node = make_node(), make_node()
    caller.redis_store.answer_waiters = 0  # every call waits on the node channel
    at_service = record_dispatches(service_node)
    cancel = CancelToken()
    threading.Thread(target=_catch, args=(caller.queue_and_wait, "busy", 1), kwargs={"cancel": cancel},
                     daemon=True).start()
    request = service_node.dequeue("busy", 5)
    assert request is not None
    cancel.cancel("no longer needed")  # nobody on the service node waits: its listener reads it
    assert request.cancel.wait(2), "the processor was not told"
    # on the endpoint's channel while the request is unclaimed, on the node's once claimed
    channels = (service_node.node_channel, service_node.endpoint_channel("busy"))
    cancels = [thread for kind, channel, thread in at_service if kind == "message" and channel in channels]
    assert cancels and cancels[0].startswith("pending-listener-"), cancels

    stop = serve(service_node, "many", lambda body: body, pollers=4)
    try:
        at_caller = record_dispatches(caller)
        with ThreadPoolExecutor(16, thread_name_prefix="crowd") as pool:
            bodies = list(pool.map(lambda n: caller.queue_and_wait("many", n).body, range(200)))
        assert bodies == list(range(200))
        # each reader stops when its own response came and offers the role to a waiting caller
        readers = {thread for thread in responses(at_caller, caller) if thread.startswith("crowd")}
        assert len(readers) > 1, readers
        del at_caller[:]
        call_one_at_a_time(caller, "many", 20)
    finally:
        stop.set()
    alone = responses(at_caller, caller)
    assert alone.count(threading.current_thread().name) >= 17, alone


def _through_cuttable_proxy(private_redis: PrivateRedis) -> tuple[CuttableProxy, PendingSettings]:
    """A proxy to cut, and settings through it whose heartbeats and checks come long after a test."""
    proxy = CuttableProxy(private_redis.port)
    return proxy, private_settings(private_redis, url=proxy.url, heartbeat_initial_delay_s=30.0,
                                   heartbeat_interval_s=15.0, sender_timeout_s=90.0,
                                   processor_timeout_s=60.0, pickup_timeout_s=60.0, data_loss_check_s=60.0)


def test_a_lone_caller_reading_through_a_cut_connection_gets_its_lost_response(
        private_redis: PrivateRedis) -> None:
    """The response is published while the caller's connection is cut (so lost); the calling
    thread, reader at the time, re-subscribes after the cut and re-checks: no heartbeat needed."""
    proxy, settings = _through_cuttable_proxy(private_redis)
    try:
        caller = PendingQueue(settings).start()
        caller.redis_store.answer_waiters = 0  # it waits on the node channel
        service_node = PendingQueue(direct(settings, private_redis)).start()
        try:
            at_caller = record_dispatches(caller)
            outcome: list[object] = []
            thread = threading.Thread(target=lambda: outcome.append(_catch(caller.queue_and_wait, "cut", 7)),
                                      name="the-caller")
            thread.start()
            request = service_node.dequeue("cut", 5)
            assert request is not None
            wait_for(lambda: blocked_in(thread, "_read_until"), interval=0.01,
                     what="the caller waiting for its response, reading for itself")
            cut_at = time.monotonic()  # (before the cut: a thread preempted after it would shorten it)
            proxy.cut(1.5)
            service_node.apply_response(request, "after the cut")  # published to nobody
            thread.join(15)
            elapsed = time.monotonic() - cut_at
        finally:
            caller.close()
            service_node.close()
    finally:
        proxy.close()
    assert getattr(outcome[0], "body", outcome[0]) == "after the cut"
    assert 1.4 < elapsed < 10, elapsed  # after the cut, long before the first heartbeat (30 s)
    assert responses(at_caller, caller) == []  # the response message was lost
    resubscribed = [thread for kind, channel, thread in at_caller
                    if kind == "subscribe" and channel == caller.node_channel]
    assert resubscribed == ["the-caller"], at_caller


def test_a_caller_waiting_on_its_answer_list_through_a_cut_connection_gets_its_response(
        private_redis: PrivateRedis) -> None:
    """The response is pushed to the answer list while the caller's blocking pop is cut off: the
    caller's wait breaks, and its beat right after (retried through the cut) returns the response
    from the request's state, long before the first heartbeat was due (30 s)."""
    proxy, settings = _through_cuttable_proxy(private_redis)
    try:
        caller = PendingQueue(settings).start()
        service_node = PendingQueue(direct(settings, private_redis)).start()
        try:
            # The one write's EVALSHA needs the script loaded (a fresh server falls back to the
            # plain enqueue and the channel): loaded by one plain enqueue elsewhere.
            caller.redis_store.enqueue("warm-up", "warm-up", b"warm-up", 1.0)
            outcome: list[object] = []
            def call() -> None:
                outcome.append(_catch(caller.queue_and_wait, "cut-a", 7))

            thread = threading.Thread(target=call, daemon=True)
            thread.start()
            request = service_node.dequeue("cut-a", 5)
            assert request is not None
            wait_for(lambda: any(c.get("cmd") == "blpop" for c in private_redis.client().client_list()),
                     interval=0.01, what="the caller blocked in its answer-list pop")
            cut_at = time.monotonic()  # (before the cut: a thread preempted after it would shorten it)
            proxy.cut(1.5)
            assert service_node.apply_response(request, "after the cut") is Delivery.DELIVERED
            thread.join(15)
            elapsed = time.monotonic() - cut_at
        finally:
            caller.close()
            service_node.close()
    finally:
        proxy.close()
    assert getattr(outcome[0], "body", outcome[0]) == "after the cut"
    assert 1.4 < elapsed < 10, elapsed
    assert keys_without_ttl(private_redis.client(), settings.prefix) == []


def test_a_poller_blocked_through_a_cut_connection_takes_the_request_queued_during_the_cut(
        private_redis: PrivateRedis) -> None:
    """The poller's blocking pop loses its connection; it reconnects (retrying for the window) and
    pops the request the caller queued while the poller could not reach Redis."""
    proxy, settings = _through_cuttable_proxy(private_redis)
    try:
        service_node = PendingQueue(settings).start()
        caller = PendingQueue(direct(settings, private_redis)).start()
        try:
            taken: list[object] = []
            poller = threading.Thread(target=lambda: taken.append(service_node.dequeue("cut-pop", 20)))
            poller.start()
            wait_for(lambda: blocked_in(poller, "dequeue", "read_response"), interval=0.01,
                     what="the poller blocked in its pop")
            cut_at = time.monotonic()  # (before the cut: a thread preempted after it would shorten it)
            proxy.cut(1.5)
            call = threading.Thread(target=_catch, args=(caller.queue_and_wait, "cut-pop", 1), daemon=True)
            call.start()
            poller.join(15)
            elapsed = time.monotonic() - cut_at
            request = taken[0]
            assert request is not None and request.body == 1
            service_node.apply_response(request, "ok")
            call.join(5)
        finally:
            caller.close()
            service_node.close()
    finally:
        proxy.close()
    assert proxy.cuts == 1
    assert 1.4 < elapsed < 10, elapsed  # after the cut, long before the poll's end (20 s)
