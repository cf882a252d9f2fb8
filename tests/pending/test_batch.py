"""The script batcher: concurrent calls share round trips, each gets its own reply or error."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from switchyard.pending.batch import ScriptBatcher
from tests.pending.conftest import PrivateRedis

# Slow enough (a busy loop of ~2 ms) that calls arriving meanwhile pile up behind it.
ECHO = """
local n = 0
for i = 1, 20000 do n = n + i end
if ARGV[1] == 'fail' then return redis.error_reply('asked to fail') end
return ARGV[1]
"""


def test_concurrent_calls_share_round_trips_and_each_gets_its_own_reply(private_redis: PrivateRedis) -> None:
    client = private_redis.client()
    batcher = ScriptBatcher(client)
    echo = client.register_script(ECHO)
    start = threading.Barrier(32)

    def call(i: int) -> bytes:
        start.wait()
        return [batcher.call(echo, [], [f"v{i}-{j}"]) for j in range(20)]

    with ThreadPoolExecutor(32) as pool:
        replies = list(pool.map(call, range(32)))
    assert replies == [[f"v{i}-{j}".encode() for j in range(20)] for i in range(32)]
    assert batcher.calls == 640
    assert batcher.round_trips < 640 / 2, "concurrent calls did not share round trips"


def test_a_lone_call_is_one_round_trip(private_redis: PrivateRedis) -> None:
    client = private_redis.client()
    batcher = ScriptBatcher(client)
    echo = client.register_script(ECHO)
    assert [batcher.call(echo, [], [str(i)]) for i in range(3)] == [b"0", b"1", b"2"]
    assert (batcher.round_trips, batcher.calls) == (3, 3)


def test_an_error_reaches_its_own_caller_only_and_lost_scripts_are_loaded_again(
        private_redis: PrivateRedis) -> None:
    client = private_redis.client()
    batcher = ScriptBatcher(client)
    echo = client.register_script(ECHO)
    client.script_flush()  # as after a Redis restart: EVALSHA answers NOSCRIPT
    start = threading.Barrier(16)

    def call(i: int) -> object:
        start.wait()
        try:
            return batcher.call(echo, [], ["fail" if i % 4 == 0 else str(i)])
        except redis.ResponseError as exc:
            return str(exc)

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(call, range(16)))
    assert replies == ["asked to fail" if i % 4 == 0 else str(i).encode() for i in range(16)]
    assert batcher.round_trips < 16


def test_an_unreachable_redis_fails_every_call_of_the_round_trip() -> None:
    from tests.pending.conftest import free_port

    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    batcher = ScriptBatcher(client)
    echo = client.register_script(ECHO)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(batcher.call, echo, [], ["x"]) for _ in range(8)]
    for future in futures:
        with pytest.raises(redis.ConnectionError):
            future.result()


def test_a_busy_node_shares_round_trips_and_unlinks_answered_states_in_batches(
        private_redis: PrivateRedis) -> None:
    """40 callers at once on one node: fewer round trips than script calls, every answer to its
    own caller, and the answered states gone within the reaper's interval, by few UNLINKs."""
    from switchyard.pending import PendingQueue
    from switchyard.pending.watcher import REAP_INTERVAL_S
    from tests.pending.conftest import private_settings
    from tests.pending.test_queue import serve

    settings = private_settings(private_redis)
    client = private_redis.client()
    with PendingQueue(settings).start() as caller, PendingQueue(settings).start() as service:
        stop = serve(service, "busy", lambda body: body * 2, pollers=8)
        caller.redis_store.answer_waiters = 0  # every enqueue through the batcher
        try:
            client.config_resetstat()
            with ThreadPoolExecutor(40) as pool:
                answers = list(pool.map(lambda i: [caller.queue_and_wait("busy", i * 100 + j).body
                                                   for j in range(5)], range(40)))
            assert answers == [[2 * (i * 100 + j) for j in range(5)] for i in range(40)]
            assert caller.redis_store.batch.calls == 200
            assert caller.redis_store.batch.round_trips < 200, "concurrent enqueues did not share round trips"
            time.sleep(REAP_INTERVAL_S * 3)
            assert list(client.scan_iter(match=f"{settings.prefix}:{{busy}}:r:*")) == []
            unlinks = client.info("commandstats").get("cmdstat_unlink", {}).get("calls", 0)
            assert 1 <= unlinks < 100, unlinks
        finally:
            stop.set()
