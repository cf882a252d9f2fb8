"""AsyncRpcClient on the real RabbitMQ, workers in real subprocesses: the blocking client's errors
and isolation from asyncio, a loop that never blocks, and cancellation that frees the slot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pika
import pytest

from switchyard.core.errors import InvalidNameError
from switchyard.rpc import AsyncRpcClient, protocol
from switchyard.rpc.client.schedule import declare_reply_queue
from switchyard.rpc.errors import (
    CallTimeoutError,
    ClientBusyError,
    ClientClosedError,
    PoolNotFoundError,
    RemoteError,
)
from switchyard.rpc.settings import RpcSettings
from tests.conftest import unique, wait_for
from tests.rpc.conftest import get_message
from tests.rpc.test_rpc import SLEEPY, bind

WHOAMI = "tests.rpc.handlers:whoami"
FAIL = "tests.rpc.handlers:fail"


def serve(pool, workers, key: str, handler: str, **env: str) -> None:
    name, settings = pool
    bind(name, settings, key)
    workers.start(name, key, handler, **env)
    workers.wait_consuming(settings, protocol.request_queue(name, key))


class Ticks:
    """A coroutine that ticks every 10 ms: the longest gap says how long the loop was blocked."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self) -> Ticks:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


def test_call_submit_and_send_with_errors_for_their_caller_alone(pool, workers) -> None:
    name, settings = pool
    serve(pool, workers, "who", WHOAMI)
    serve(pool, workers, "bad", FAIL)

    async def main() -> None:
        async with AsyncRpcClient(name, settings, timeout=10) as client:
            with Ticks() as ticks:
                answers = await asyncio.gather(*(client.call("who", f"n{i}") for i in range(50)))
                assert [a.text().split("|")[2] for a in answers] == [f"n{i}" for i in range(50)]
                future = await client.submit("who", "submitted")
                assert (await future).text().endswith("|who|submitted")
                await client.send("who", "nobody waits")
                # Bad calls fail alone, in their own coroutine, beside good ones.
                results = await asyncio.gather(
                    client.call("who", "fine"), client.call("a\x00b", "bad key"),
                    client.call("who", object()),  # type: ignore[arg-type]
                    client.call("who", "x", timeout=-1), client.call("bad", "boom"),
                    return_exceptions=True)
                assert results[0].text().endswith("|who|fine")
                assert isinstance(results[1], InvalidNameError)
                assert isinstance(results[2], TypeError)
                assert isinstance(results[3], ValueError)
                assert not results[4].ok and results[4].status == protocol.Status.ERROR
                with pytest.raises(RemoteError):
                    results[4].raise_for_status()
            assert ticks.longest < 0.5, f"the loop was blocked for {ticks.longest:.2f}s"
            assert client.in_flight == 0
            assert client.stats.responses >= 53
        with pytest.raises(ClientClosedError):
            await client.call("who", "after close")

    asyncio.run(main())


def test_a_pool_nobody_initialized_fails_at_open() -> None:
    async def main() -> None:
        with pytest.raises(PoolNotFoundError, match="switchyard pool init"):
            async with AsyncRpcClient(unique("nopool"), RpcSettings.from_env()):
                pass

    asyncio.run(main())


def test_a_timeout_is_the_callers_and_the_late_answer_is_stale(pool, workers) -> None:
    name, settings = pool
    serve(pool, workers, "slow", SLEEPY, SLEEPY_SECONDS="0.6", WORKER_PREFETCH="4")

    async def main() -> None:
        async with AsyncRpcClient(name, settings, concurrency=1) as client:
            with pytest.raises(CallTimeoutError):
                await client.call("slow", "A", timeout=0.2, expiration_ms=10_000)
            assert (await client.call("slow", "B", timeout=5, expiration_ms=10_000)).body == b"B"
            assert client.stats.stale_responses == 1

    asyncio.run(main())


def test_a_cancelled_call_frees_its_slot_at_once(pool, workers) -> None:
    name, settings = pool
    serve(pool, workers, "slow", SLEEPY, SLEEPY_SECONDS="1.0", WORKER_PREFETCH="4")

    async def main() -> None:
        async with AsyncRpcClient(name, settings, concurrency=1, timeout=30) as client:
            task = asyncio.create_task(client.call("slow", "A"))
            await asyncio.to_thread(wait_for, lambda: client.stats.published == 1, 10, 0.005,
                                    what="A published")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert client.in_flight == 0  # freed now, not 30 s from now
            started = time.monotonic()
            answer = await client.call("slow", "B", timeout=10)  # the only slot: A's, taken again
            assert answer.body == b"B"
            assert time.monotonic() - started < 5
            await asyncio.to_thread(wait_for, lambda: client.stats.stale_responses == 1, 10,
                                    what="A's answer, counted stale")

            # Cancelled while waiting for a slot: it never takes one.
            holder = await client.submit("slow", "C")
            waiting = asyncio.create_task(client.call("slow", "D"))
            await asyncio.sleep(0)  # waiting sits in the semaphore
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert (await holder).body == b"C"
            assert client.in_flight == 0
            assert client.stats.published == 3  # A, B, C: D was never sent

    asyncio.run(main())


def test_all_slots_taken_waits_on_the_loop_then_reports_busy(pool, workers) -> None:
    name, settings = pool
    serve(pool, workers, "slow", SLEEPY, SLEEPY_SECONDS="1.0")

    async def main() -> None:
        async with AsyncRpcClient(name, settings, concurrency=2, timeout=5) as client:
            first = [await client.submit("slow", str(i)) for i in range(2)]
            assert client.in_flight == 2
            with Ticks() as ticks:
                started = time.monotonic()
                with pytest.raises(ClientBusyError):
                    await client.submit("slow", "late", timeout=0.3)
                assert 0.25 < time.monotonic() - started < 0.9
                # A slot that frees up within the wait is taken: the third call waits, then runs.
                third = await client.call("slow", "third", timeout=8)
            assert ticks.longest < 0.2, f"the loop was blocked for {ticks.longest:.2f}s"
            assert third.body == b"third"
            assert [(await f).body for f in first] == [b"0", b"1"]

    asyncio.run(main())


@pytest.fixture
def reply_queue() -> Iterator[tuple[RpcSettings, str]]:
    settings = RpcSettings.from_env()
    reply = unique("r")
    queue = declare_reply_queue(settings, reply)
    yield settings, reply
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    connection.channel().queue_delete(queue)
    connection.close()


def answer(settings: RpcSettings, reply: str, *call_ids: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    channel = connection.channel()
    for call_id in call_ids:
        channel.basic_publish("", protocol.reply_queue(reply), f"answer {call_id}".encode(),
                              pika.BasicProperties(correlation_id=call_id,
                                                   headers={protocol.STATUS_HEADER: "ok"}))
    connection.close()


def test_collect_and_a_cancelled_collect_puts_back_what_it_took(reply_queue) -> None:
    settings, reply = reply_queue
    answer(settings, reply, "a", "b")

    async def main() -> None:
        client = AsyncRpcClient(unique("p"), settings)  # collect needs no pool: nothing opened
        found = await client.collect(reply, ["a"], timeout=5)
        assert set(found) == {"a"} and found["a"].body == b"answer a" and found["a"].ok
        task = asyncio.create_task(client.collect(reply, ["b", "never"], timeout=30))
        queue = protocol.reply_queue(reply)
        # "b" taken (acked), the collector waits for "never".
        await asyncio.to_thread(wait_for, lambda: get_message(settings, queue, 0.05, keep=True) is None,
                                10, what="b taken by the collector")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        back = await client.collect(reply, ["b"], timeout=5)
        assert back["b"].body == b"answer b" and back["b"].ok

    asyncio.run(main())
