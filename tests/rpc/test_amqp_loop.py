"""The connection helpers the client and worker drive pika with (``switchyard.rpc.amqp``): a pass of
the loop that waits no longer than asked, wakes from another thread, raises when the connection is
lost; consumers on the underlying channel; frames sent when written, even those the socket cannot
take at once. On a real broker (through a cuttable proxy where the test needs a lost connection)."""

from __future__ import annotations

import errno
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pika
import pika.exceptions
import pytest

from switchyard.core.config import Connections
from switchyard.rpc.amqp import (
    LoopPasses,
    cancel_direct,
    connect,
    consume_direct,
    publish_buffered,
    wake_threadsafe,
    written_together,
)
from tests.pending.tcp_proxy import CuttableProxy


@pytest.fixture
def connection() -> Iterator[pika.BlockingConnection]:
    connection = connect(Connections.from_env().amqp_url, "amqp-loop-test")
    yield connection
    if connection.is_open:
        connection.close()


@pytest.fixture
def queue(connection: pika.BlockingConnection) -> Iterator[str]:
    name = f"amqp-loop-{uuid.uuid4().hex[:8]}"
    connection.channel().queue_declare(name, auto_delete=False)
    yield name
    with connect(Connections.from_env().amqp_url, "amqp-loop-cleanup") as cleanup:
        cleanup.channel().queue_delete(name)


def test_a_pass_waits_no_longer_than_asked(connection: pika.BlockingConnection) -> None:
    passes = LoopPasses(connection)
    started = time.monotonic()
    passes.run(started + 0.3)
    assert 0.25 <= time.monotonic() - started < 1.5
    # A later bound keeps the earlier timer; an earlier one replaces it.
    started = time.monotonic()
    passes.run(started + 0.1)
    assert time.monotonic() - started < 1.0


def test_a_wake_from_another_thread_ends_the_pass_and_runs_there(connection: pika.BlockingConnection) -> None:
    ran_on: list[int] = []
    note = lambda: ran_on.append(threading.get_ident())  # noqa: E731
    threading.Timer(0.2, lambda: wake_threadsafe(connection, note)).start()
    started = time.monotonic()
    passes = LoopPasses(connection)
    while not ran_on and time.monotonic() - started < 5:
        passes.run(started + 5)
    assert ran_on == [threading.get_ident()]
    assert time.monotonic() - started < 2


def test_a_closed_connection_refuses_a_wake(connection: pika.BlockingConnection) -> None:
    connection.close()
    with pytest.raises(pika.exceptions.ConnectionWrongStateError):
        wake_threadsafe(connection, lambda: None)


def test_a_lost_connection_raises_from_the_pass() -> None:
    proxy = CuttableProxy(urlsplit(Connections.from_env().amqp_url).port or 5672)
    try:
        connection = connect(proxy.through(Connections.from_env().amqp_url), "amqp-loop-cut")
        passes = LoopPasses(connection)
        proxy.cut(5)
        with pytest.raises(pika.exceptions.AMQPError):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                passes.run(time.monotonic() + 0.2)
        assert connection.is_closed
    finally:
        proxy.close()


def test_a_direct_consumer_gets_deliveries_in_a_pass_and_stops_when_cancelled(
        connection: pika.BlockingConnection, queue: str) -> None:
    channel = connection.channel()
    got: list[bytes] = []
    tag = consume_direct(channel, queue, lambda _ch, _m, _p, body: got.append(body), auto_ack=True)
    channel.basic_publish("", queue, b"one")
    passes = LoopPasses(connection)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        passes.run(time.monotonic() + 0.2)
    assert got == [b"one"]
    cancel_direct(channel, tag)
    channel.basic_publish("", queue, b"two")
    passes.run(time.monotonic() + 0.5)
    assert got == [b"one"]
    assert channel.queue_declare(queue, passive=True).method.message_count == 1


def test_consuming_a_missing_queue_raises_not_found(connection: pika.BlockingConnection) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        consume_direct(connection.channel(), f"amqp-loop-missing-{uuid.uuid4().hex[:8]}", lambda *_: None)
    assert raised.value.reply_code == 404


class _TrickleSocket:
    """The connection's socket, taking at most 64 KiB a send and refusing every other one (EAGAIN),
    as a full send buffer does: deterministic, whatever the kernel's buffers would take."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.sends = 0

    def send(self, data: bytes) -> int:
        self.sends += 1
        if self.sends % 2 == 0:
            raise BlockingIOError(errno.EAGAIN, "would block")
        return self._sock.send(memoryview(data)[:64 * 1024])

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


@pytest.mark.parametrize("size", [10, 4 * 1024 * 1024], ids=["small", "more-than-one-send-takes"])
def test_frames_written_together_arrive_whole(connection: pika.BlockingConnection, queue: str,
                                              size: int) -> None:
    """The first send takes part of the frames: the loop must send the rest (a cork that dropped
    them, or left no writability watch, would lose the message)."""
    transport = connection._impl._transport
    trickle = transport._sock = _TrickleSocket(transport._sock)
    channel = connection.channel()
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    trickle.sends = 0  # the block's send is the first: it takes 64 KiB
    with written_together(connection):
        publish_buffered(channel, "", queue, body, pika.BasicProperties())
        publish_buffered(channel, "", queue, b"after", pika.BasicProperties())
    assert (transport.get_write_buffer_size() > 0) == (size > 64 * 1024)
    got: list[bytes] = []
    consume_direct(channel, queue, lambda _ch, _m, _p, received: got.append(received), auto_ack=True)
    passes = LoopPasses(connection)
    deadline = time.monotonic() + 60
    while len(got) < 2 and time.monotonic() < deadline:
        passes.run(time.monotonic() + 0.5)
    assert [len(b) for b in got] == [size, 5]
    assert got[0] == body and got[1] == b"after"
    assert trickle.sends > 2 * (size // (64 * 1024))  # every other one refused
