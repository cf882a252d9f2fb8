"""``PendingQueue.serve``: a handler answers each request; bad output and Redis trouble stay local."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from switchyard.pending import (
    PendingError,
    PendingQueue,
    PendingRequest,
    RemoteError,
    Reply,
    StoreUnavailableError,
)
from switchyard.pending.streams import LocalDirectoryStore
from tests.conftest import wait_for
from tests.pending.conftest import NodeFactory, PrivateRedis, keys_without_ttl, private_settings
from tests.pending.test_queue import _catch


def serving(node: PendingQueue, endpoint: str, handler: Any) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=node.serve, args=(endpoint, handler, stop), daemon=True)
    thread.start()
    return stop, thread


def test_serve_answers_each_request_and_returns_once_stopped(
        make_node: NodeFactory, shared_redis: redis.Redis, settings: Any) -> None:
    caller, service_node = make_node(), make_node()
    stop, thread = serving(service_node, "served", lambda request: {"echo": request.body})
    try:
        bodies = [caller.queue_and_wait("served", n).body for n in range(10)]
    finally:
        stop.set()
    assert bodies == [{"echo": n} for n in range(10)]
    thread.join(settings.poll_wait_s + 2)
    assert not thread.is_alive(), "serve did not return after stop"
    assert keys_without_ttl(shared_redis, settings.prefix) == []


def test_a_failing_or_unencodable_handler_answers_with_an_error_and_serving_goes_on(
        make_node: NodeFactory) -> None:
    """Bad output is that request's problem: an exception and a body JSON cannot hold each become
    an error response to their own caller, and the same thread serves the next request."""
    caller, service_node = make_node(), make_node()

    def handler(request: PendingRequest) -> Any:
        if request.body == "raise":
            raise KeyError("no such account")
        if request.body == "unencodable":
            return {1, 2}
        if request.body == "huge":
            return "x" * (service_node.settings.max_message_bytes + 1)
        return request.body

    stop, _ = serving(service_node, "bad-output", handler)
    try:
        with pytest.raises(RemoteError, match="KeyError: 'no such account'"):
            caller.queue_and_wait("bad-output", "raise")
        with pytest.raises(RemoteError, match="not JSON-serialisable"):
            caller.queue_and_wait("bad-output", "unencodable")
        with pytest.raises(RemoteError, match="MAX_MESSAGE_BYTES"):
            caller.queue_and_wait("bad-output", "huge")
        assert caller.queue_and_wait("bad-output", "fine").body == "fine"
    finally:
        stop.set()


def test_a_reply_with_streams_goes_through_the_store(make_node: NodeFactory, tmp_path: Any) -> None:
    store = LocalDirectoryStore(tmp_path)
    caller, service_node = make_node(), make_node()
    caller.store = service_node.store = store
    report = b"\x00" * 4096
    stop, _ = serving(service_node, "streams", lambda request: Reply("see stream", {"report": report}))
    try:
        response = caller.queue_and_wait("streams", "go")
    finally:
        stop.set()
    assert response.body == "see stream"
    assert [store.read(ref) for ref in response.streams] == [report]


def test_an_answer_finished_after_close_is_still_delivered(make_node: NodeFactory) -> None:
    """The node closes while a handler runs: the answer it then returns is still sent, so the
    caller, on another node, gets it."""
    caller, service_node = make_node(), make_node()
    started, finish = threading.Event(), threading.Event()

    def slow(request: PendingRequest) -> Any:
        started.set()
        finish.wait(5)
        return "finished"

    outcome: list[Any] = []
    call = threading.Thread(target=lambda: outcome.append(_catch(caller.queue_and_wait, "closing", 1)))
    call.start()
    _, thread = serving(service_node, "closing", slow)
    assert started.wait(5)
    service_node.close()
    finish.set()
    thread.join(5)
    call.join(5)
    assert not thread.is_alive()
    assert getattr(outcome[0], "body", outcome[0]) == "finished"


def test_a_script_redis_lost_is_loaded_again_and_the_answer_delivered(private_redis: PrivateRedis) -> None:
    """SCRIPT FLUSH (as after a Redis restart) between two requests: the answer gets NOSCRIPT,
    redis-py's Script loads the script again, and the answer arrives at once."""
    settings = private_settings(private_redis)
    client = private_redis.client()
    with PendingQueue(settings).start() as caller, PendingQueue(settings).start() as service_node:
        def handler(request: PendingRequest) -> Any:
            if request.body == 1:
                client.script_flush()
            return request.body + 100

        stop, _ = serving(service_node, "flushed", handler)
        try:
            assert caller.queue_and_wait("flushed", 0).body == 100
            started = time.monotonic()
            assert caller.queue_and_wait("flushed", 1).body == 101
            assert time.monotonic() - started < 2, "the answer waited for something else"
            assert caller.queue_and_wait("flushed", 2).body == 102
        finally:
            stop.set()


def test_a_refused_pop_is_a_clear_error_and_leaves_the_connection_in_step(
        make_node: NodeFactory, shared_redis: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """The pending list's key holds a string (WRONGTYPE): dequeue raises a PendingError naming it,
    serve logs it and polls again; both replies of the pop were read, so once the key is fixed the
    same poller connection gets the right replies and the next request is served."""
    caller, service_node = make_node(), make_node()
    pending = service_node.pending_key("wrong")
    shared_redis.set(pending, "not a list")
    with pytest.raises(PendingError, match=r"refused the pop on 'wrong'.*WRONGTYPE"):
        service_node.dequeue("wrong", 0.2)
    stop, _ = serving(service_node, "wrong", lambda request: request.body + 1)
    try:
        wait_for(lambda: "serving wrong: Redis refused the pop" in caplog.text, what="the refusal logged")
        shared_redis.delete(pending)
        assert caller.queue_and_wait("wrong", 1).body == 2
        assert caller.queue_and_wait("wrong", 2).body == 3
    finally:
        stop.set()


def test_redis_out_of_memory_is_logged_and_serving_and_the_watch_go_on(
        private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture) -> None:
    """Redis over its maxmemory (noeviction) for a while: the pops and the data-loss checks are
    refused (OOM), logged, and tried again; neither the serving loop nor the node's watch thread
    ends (the watch thread used to die of it: no more heartbeats or data-loss checks). Once memory
    is back, requests are served. The request in the handler then gets its answer or, if Redis
    refused that too, ProcessorLostError: never a silent hang."""
    settings = private_settings(private_redis)
    client = private_redis.client()
    full = threading.Event()
    with PendingQueue(settings).start() as caller, PendingQueue(settings).start() as service_node:
        def handler(request: PendingRequest) -> Any:
            if request.body == "first":
                client.config_set("maxmemory-policy", "noeviction")
                client.config_set("maxmemory", "1")
                full.set()
            return request.body

        stop, _ = serving(service_node, "oom", handler)
        try:
            outcome: list[Any] = []
            call = threading.Thread(target=lambda: outcome.append(
                _catch(caller.queue_and_wait, "oom", "first")))
            call.start()
            assert full.wait(5)
            wait_for(lambda: "serving oom: Redis refused the pop" in caplog.text, what="a refused pop logged")
            wait_for(lambda: "data-loss check failed" in caplog.text, what="a refused data-loss check logged")
            client.config_set("maxmemory", "0")
            call.join(10)
            assert getattr(outcome[0], "body", type(outcome[0]).__name__) in ("first", "ProcessorLostError")
            assert caller.queue_and_wait("oom", "second").body == "second"
            watch = [t for t in service_node._threads if t.name.startswith("pending-watchdog")]
            assert watch and watch[0].is_alive(), "the watch thread died"
        finally:
            client.config_set("maxmemory", "0")
            stop.set()


def test_serve_on_a_node_not_started_or_closed_says_so(settings: Any) -> None:
    node = PendingQueue(settings)
    with pytest.raises(PendingError, match="start"):
        node.serve("svc", lambda request: None)
    node.start()
    node.close()
    with pytest.raises(StoreUnavailableError, match="shutting down"):
        node.serve("svc", lambda request: None)
    with pytest.raises(ValueError, match="endpoint must match"):
        PendingQueue(settings).serve("bad endpoint{}", lambda request: None)
