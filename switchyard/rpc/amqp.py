"""pika connection helpers shared by the client, the worker and the topology code.

The one module (with ``amqp_decode``) that reaches into pika's internals; each name it uses is in
``pika_internals.INTERNALS`` with what it buys, and pika is pinned to that module's version."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard, TypeVar

import pika
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel
from pika.adapters.utils.io_services_utils import _TRY_IO_AGAIN_SOCK_ERROR_CODES, _AsyncPlaintextTransport

from switchyard.core.config import AMQP_URL, service_urls
from switchyard.core.errors import ConfigError
from switchyard.rpc import amqp_decode
from switchyard.rpc.errors import BrokerUnavailableError
from switchyard.rpc.settings import heartbeat_from_env

# struct tcp_info up to tcpi_last_ack_recv: 8 one-byte fields, 9 u32, then last_data_sent,
# last_ack_sent, last_data_recv, last_ack_recv (ms ago).
TCP_INFO_LAYOUT = "8B9I4I"
_T = TypeVar("_T")


def amqp_urls(amqp_url: str) -> list[str]:
    """The URLs of a ``SWITCHYARD_AMQP_URL`` that may list several nodes of one cluster (as
    ``scripts/rabbitmq-cluster.sh urls`` prints them; ``service_urls``)."""
    return service_urls(amqp_url) or [amqp_url]


def url_parameters(amqp_url: str) -> pika.URLParameters:
    """pika's reading of an AMQP URL (the first of a list, every one checked), or a ConfigError that
    names the setting (the URL itself is not repeated: it may hold a password)."""
    params = [_url_parameters(url) for url in amqp_urls(amqp_url)]
    return params[0]


def _url_parameters(amqp_url: str) -> pika.URLParameters:
    try:
        return pika.URLParameters(amqp_url)
    except (ValueError, IndexError, TypeError, KeyError) as exc:
        raise ConfigError(f"{AMQP_URL.name} is not an AMQP URL ({type(exc).__name__}: {exc}); expected "
                          "amqp[s]://user:password@host:port/vhost (vhost %2F for /), or several "
                          "separated by commas") from exc


def connection_parameters(amqp_url: str, name: str, heartbeat: int | None = None) -> pika.URLParameters:
    """The parameters of one URL (not a list) for a connection named ``name``."""
    params = _url_parameters(amqp_url)
    params.client_properties = {"connection_name": name, "product": "switchyard"}
    params.heartbeat = heartbeat_from_env() if heartbeat is None else heartbeat
    params.blocked_connection_timeout = 60
    params.connection_attempts = 1
    return params


def connect(amqp_url: str, name: str, heartbeat: int | None = None) -> pika.BlockingConnection:
    """Open a blocking connection, turning pika's failures into a message that says what to do.
    Its deliveries' headers are decoded by ``amqp_decode``: one message's never loses the connection.

    A list of URLs (the nodes of a cluster) is tried from a random one, then in turn: connections
    spread over the nodes, as behind a cluster's load balancer, and one lost with its node finds
    another at once. Every URL is checked before any is tried."""
    amqp_decode.install()
    urls = amqp_urls(amqp_url)
    params = [connection_parameters(url, name, heartbeat) for url in urls]
    first = random.randrange(len(urls))
    failures = []
    last: Exception | None = None
    for url, param in zip(urls[first:] + urls[:first], params[first:] + params[:first], strict=True):
        try:
            connection = pika.BlockingConnection(param)
        except pika.exceptions.AMQPError as exc:
            failures.append(f"{redact(url)} ({type(exc).__name__}: {exc})")
            last = exc
            continue
        _coalesce_writes(connection)
        return connection
    raise BrokerUnavailableError(
        f"cannot connect to RabbitMQ at {', '.join(failures)}. "
        f"Start RabbitMQ there, or set {AMQP_URL.name} (switchyard -b URL) to where it runs."
    ) from last


def is_alive(connection: pika.BlockingConnection | None) -> TypeGuard[pika.BlockingConnection]:
    """Whether a connection kept between uses (e.g. across Lambda invocations) still works.

    Processing pending I/O surfaces a close the broker sent meanwhile (heartbeat timeout, restart).
    """
    if connection is None or not connection.is_open:
        return False
    try:
        connection.process_data_events(time_limit=0)
    except pika.exceptions.AMQPError:
        return False
    return connection.is_open and _heard_from(connection)


def _heard_from(connection: pika.BlockingConnection) -> bool:
    """Whether the broker sent anything within two heartbeat intervals, by the kernel's own record
    (TCP_INFO's last data received; Linux). An idle broker sends heartbeats, so a kept connection
    that received nothing for that long goes through a half-open path (dropped without a RST):
    trusted, it failed only at the next publish's confirm timeout or heartbeat check, while the
    control plane's orphans waited. Where the record cannot be read, the connection is trusted."""
    heartbeat = connection._impl.params.heartbeat
    if not heartbeat:
        return True
    try:
        info = connection._impl._transport._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        last_data_recv_ms = struct.unpack_from(TCP_INFO_LAYOUT, info)[-2]
    except (AttributeError, OSError, struct.error):
        return True
    return last_data_recv_ms <= 2 * heartbeat * 1000


def redact(url: str) -> str:
    """The URL (each of a list) with its password hidden, for messages and logs."""
    return ",".join(f"amqp://{params.credentials.username}:***@{params.host}:{params.port}/"
                    for params in map(_url_parameters, amqp_urls(url)))


# pika's BlockingChannel hides two things Switchyard needs; both are reached through its
# underlying asynchronous channel (``_impl``) or state, in this one place only.


def _coalesce_writes(connection: pika.BlockingConnection) -> None:
    """Send everything buffered in one ``send`` instead of one per frame, and let ``written_together``
    send without the loop on a plain connection.

    pika queues each frame (a publish is three, an ack one) as its own chunk and sends chunk by
    chunk: a worker's reply and ack cost four system calls, a client's publish three. Joining the
    chunks first does the same I/O in one call. Skipped if pika's transport is not the one known.
    """
    transport: Any = getattr(connection._impl, "_transport", None)
    produce = getattr(transport, "_produce", None)
    if produce is None or not hasattr(transport, "_tx_buffers"):
        return

    def produce_joined() -> None:
        buffers = transport._tx_buffers
        if len(buffers) > 1:
            joined = b"".join(buffers)
            buffers.clear()
            buffers.append(joined)
        produce()

    transport._produce = produce_joined
    if type(transport) is _AsyncPlaintextTransport:
        transport._switchyard_cork = _Cork(transport)


class _Cork:
    """While on, a plain transport's writes are only buffered: no writability watch is turned on
    (two ``epoll_ctl`` calls and a pass of the loop per request); ``flush`` sends them, and leaves
    the loop to send what the socket would not take yet."""

    def __init__(self, transport: Any) -> None:
        self.on = False
        self._transport = transport
        self._write = transport.write
        transport.write = self.write

    def write(self, data: bytes) -> None:
        transport = self._transport
        if self.on and transport._state == transport._STATE_ACTIVE:
            transport._buffer_tx_data(data)
        else:
            self._write(data)

    def flush(self) -> None:
        transport = self._transport
        if not transport._tx_buffers or transport._state != transport._STATE_ACTIVE:
            return
        try:
            transport._produce()
        except OSError as error:  # as pika's own writable handler does
            if error.errno not in _TRY_IO_AGAIN_SOCK_ERROR_CODES:
                transport._initiate_abort(error)
                return
        if transport._tx_buffers:
            transport._nbio.set_writer(transport._sock.fileno(), transport._on_socket_writable)


@contextlib.contextmanager
def written_together(connection: pika.BlockingConnection) -> Iterator[None]:
    """The frames buffered inside (``publish_buffered``, ``ack_buffered``) are sent when the block
    ends, in one ``send``, instead of when the loop's next pass finds the socket writable.

    On a plain connection they are only buffered meanwhile (see ``_Cork``); on TLS they are sent by
    the handler the loop would run. Either way a socket that cannot take them yet leaves them to
    the loop, as before.
    """
    transport: Any = connection._impl._transport
    cork: _Cork | None = getattr(transport, "_switchyard_cork", None)
    if cork is None or transport._tx_buffers:  # a watch is on already: the loop sends these too
        try:
            yield
        finally:
            send_now(connection)
        return
    cork.on = True
    try:
        yield
    finally:
        cork.on = False
        cork.flush()


def enable_async_confirms(channel: BlockingChannel, on_ack_nack: Callable[[Any], None]) -> None:
    """Turn on publisher confirms with an ack/nack callback instead of a wait per publish.

    BlockingChannel.confirm_delivery makes each basic_publish block until its confirm, which
    serializes a pipeline. The callback runs inside pika's frame processing: it must not call
    blocking methods (defer such work to after the publish loop).
    """
    _answered(channel, lambda on_ok: channel._impl.confirm_delivery(ack_nack_callback=on_ack_nack,
                                                                    callback=on_ok),
              "confirm.select")


def publish_buffered(channel: BlockingChannel, exchange: str, routing_key: str, body: bytes,
                     properties: pika.BasicProperties, mandatory: bool = False) -> None:
    """basic_publish without BlockingChannel's socket flush per message (about 10x cheaper).

    The frames are written by the next ``process_data_events``: batch publishers and consumer
    callbacks publish many, then let the loop write them at once.
    """
    channel._impl.basic_publish(exchange, routing_key, body, properties, mandatory)


def ack_buffered(channel: BlockingChannel, delivery_tag: int, multiple: bool = False) -> None:
    """basic_ack without a flush; written with the frames around it."""
    channel._impl.basic_ack(delivery_tag, multiple=multiple)


def consume_direct(channel: BlockingChannel, queue: str, on_message: Callable[..., None],
                   auto_ack: bool = False, on_cancel: Callable[[], None] | None = None,
                   timeout: float = 10.0) -> str:
    """Consume with the callback on the underlying channel: it runs as the frames arrive, in any
    pass of the connection's loop (``LoopPasses.run`` or ``process_data_events``), without
    BlockingChannel queueing each delivery as an event to dispatch later.

    ``on_cancel`` runs (in the loop) if the broker cancels the consumer (its queue was deleted).
    Waits for the consume-ok like ``basic_consume``; a refusal (no such queue) raises
    ``ChannelClosedByBroker`` from here as it would from there. Returns the consumer tag.
    """
    def consume(on_ok: Callable[[Any], None]) -> str:
        tag: str = channel._impl.basic_consume(queue, on_message, auto_ack=auto_ack, callback=on_ok)
        _direct_consumers(channel)[tag] = on_cancel
        return tag

    return _answered(channel, consume, f"a consume on {queue!r}", timeout)


def _direct_consumers(channel: BlockingChannel) -> dict[str, Callable[[], None] | None]:
    """The channel's direct consumers, by tag. BlockingChannel's handler of a broker's cancel knows
    only its own consumers (for another it raises KeyError, which tears the connection down): it is
    replaced by one that hands direct consumers' cancels to their ``on_cancel``."""
    direct: dict[str, Callable[[], None] | None] | None = getattr(channel, "_switchyard_direct", None)
    if direct is not None:
        return direct
    found: dict[str, Callable[[], None] | None] = {}
    blocking_handler = channel._on_consumer_cancelled_by_broker

    def on_cancel(frame: Any) -> None:
        tag = frame.method.consumer_tag
        if tag not in found:
            blocking_handler(frame)
            return
        callback = found.pop(tag)
        if callback is not None:
            callback()

    impl = channel._impl
    impl.callbacks.remove(impl.channel_number, pika.spec.Basic.Cancel, blocking_handler)
    impl.add_on_cancel_callback(on_cancel)
    channel._switchyard_direct = found
    return found


def cancel_direct(channel: BlockingChannel, consumer_tag: str, timeout: float = 10.0) -> None:
    """Cancel a ``consume_direct`` consumer (BlockingChannel.basic_cancel does not know it) and wait
    for the cancel-ok: deliveries that were on their way meanwhile have reached the callback."""
    _direct_consumers(channel).pop(consumer_tag, None)
    if consumer_tag not in channel._impl.consumer_tags:  # the broker cancelled it already
        return
    _answered(channel, lambda on_ok: channel._impl.basic_cancel(consumer_tag, callback=on_ok),
              "a cancel", timeout, quiet=True)


def _answered(channel: BlockingChannel, send: Callable[[Callable[[Any], None]], _T], what: str,
              timeout: float = 10.0, quiet: bool = False) -> _T:
    """Send a method on the underlying channel (``send(on_ok)``, which returns what it returns)
    and pump the connection until the broker's answer runs ``on_ok``. A channel closed meanwhile
    raises its reason, no answer within ``timeout`` raises ``BrokerUnavailableError``; ``quiet``:
    either just ends the wait."""
    answered: list[bool] = []
    result = send(lambda _frame: answered.append(True))
    deadline = time.monotonic() + timeout
    # Passes that end when the answer came: ``process_data_events(time_limit)`` would wait out its
    # whole limit (it ends early only for BlockingChannel's own dispatch, never for this callback),
    # 50 ms per method: a worker's start paid it twice, confirm.select and basic.consume.
    passes = LoopPasses(channel.connection)
    while not answered:
        if channel.is_closed:
            if quiet:
                break
            reason = close_reason(channel)
            raise reason if isinstance(reason, pika.exceptions.AMQPError) else \
                pika.exceptions.ChannelClosed(0, f"channel closed: {reason!r}")
        if time.monotonic() > deadline:
            if quiet:
                break
            raise BrokerUnavailableError(f"the broker did not answer {what}")
        passes.run(min(deadline, time.monotonic() + 0.05))
    return result


class LoopPasses:
    """Passes of one connection's loop, each waiting for the socket at most until a given time.

    ``process_data_events`` does the same with a timer per call, output flushing and BlockingChannel's
    event queues around it; callers that consume with ``consume_direct`` need none of that. One timer
    bounds many passes: it is replaced only when a pass must end earlier than the timer fires.
    """

    def __init__(self, connection: pika.BlockingConnection) -> None:
        self.connection = connection
        self._timer: object | None = None
        self._at = 0.0  # when the timer fires (time.monotonic, pika's clock)

    def run(self, until: float) -> None:
        """One pass: wait for the socket, a ``wake_threadsafe`` or ``until``; run what came (frames,
        timers, callbacks). A lost connection raises its error, as ``process_data_events`` would."""
        connection = self.connection
        ioloop = connection._impl.ioloop
        if self._timer is None or self._at > until:
            if self._timer is not None:
                ioloop.remove_timeout(self._timer)
            self._timer = ioloop.call_later(max(0.0, until - time.monotonic()), self._fired)
            self._at = until
        ioloop.poll()
        ioloop.process_timeouts()
        if connection._impl.is_closed:
            result = connection._closed_result
            error = result.value.error if result.ready else None
            connection._cleanup()
            if isinstance(error, pika.exceptions.AMQPError):
                raise error
            raise pika.exceptions.AMQPConnectionError(f"connection closed: {error!r}")

    def _fired(self) -> None:
        self._timer = None


def wake_threadsafe(connection: pika.BlockingConnection, callback: Callable[[], None]) -> None:
    """From any thread: run ``callback`` in the connection's loop, ending a pass's wait.

    Unlike BlockingConnection.add_callback_threadsafe, the callback runs within any pass
    (``LoopPasses.run`` too), not only in ``process_data_events``. Raises ConnectionWrongStateError once
    the connection is closed.
    """
    with connection._cleanup_mutex:  # as BlockingConnection's: the loop may be closing meanwhile
        if connection.is_closed:
            raise pika.exceptions.ConnectionWrongStateError("the connection is closed")
        connection._impl.ioloop.add_callback_threadsafe(callback)


def send_now(connection: pika.BlockingConnection) -> None:
    """Write the buffered frames now, instead of when the loop's next pass finds the socket writable.

    The same handler the loop would run (a socket that cannot take them yet keeps them buffered, as
    there); it saves a pass of the loop per request, on a plain or a TLS connection alike.
    """
    transport: Any = connection._impl._transport
    if transport is not None and transport.get_write_buffer_size():
        transport._on_socket_writable()


def close_reason(channel: BlockingChannel) -> Exception | None:
    """Why a closed channel was closed (e.g. ChannelClosedByBroker with reply code 404)."""
    return getattr(channel, "_closing_reason", None)


def on_return_direct(channel: BlockingChannel, on_return: Callable[..., None]) -> None:
    """Take the broker's returns of mandatory messages on the underlying channel, as their frames
    arrive (BlockingChannel queues them until ``process_data_events`` dispatches): the broker sends
    a return before the ack, and a send settled by the ack must see it first."""
    channel._impl.add_on_return_callback(on_return)


def close_soon(channel: BlockingChannel) -> None:
    """Start closing the channel without waiting for the close-ok (safe inside frame processing)."""
    channel._impl.close()


def reject_buffered(channel: BlockingChannel, delivery_tag: int, requeue: bool) -> None:
    """basic_reject without a flush (safe inside frame processing)."""
    channel._impl.basic_reject(delivery_tag, requeue=requeue)


def frame_max(connection: pika.BlockingConnection) -> int:
    """The frame size negotiated with the broker: a message's properties must fit in one frame."""
    return int(connection._impl.params.frame_max)


def abandon(connection: pika.BlockingConnection, why: str) -> None:
    """Drop the connection's socket without the close handshake (a stuck channel never answers it)."""
    if connection.is_open:
        connection._impl._terminate_stream(pika.exceptions.StreamLostError(why))
    with contextlib.suppress(pika.exceptions.AMQPError):
        connection.process_data_events(time_limit=0)


def consume_answered(amqp_url: str, queue: str, timeout: float) -> bool:
    """Whether the broker answers a ``basic.consume`` on ``queue`` within ``timeout`` seconds: with
    a consume-ok or by closing the channel (refused, no such queue: an answer too). False only for
    silence, on a connection still open.

    On a connection of its own, since a quorum queue without a leader blocks the channel for the
    broker's own timeout (65 s). At most one message is delivered to the probe, and it goes back to
    the queue when the probe's channel closes. A lost connection raises ``AMQPError``.
    """
    connection = connect(amqp_url, "switchyard-queue-probe")
    answered: list[bool] = []
    channel: BlockingChannel | None = None
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        channel._impl.basic_consume(queue, lambda *_: None, callback=lambda _frame: answered.append(True))
        deadline = time.monotonic() + timeout
        while not answered and channel.is_open and time.monotonic() < deadline:
            connection.process_data_events(time_limit=min(0.1, max(0.0, deadline - time.monotonic())))
        if channel.is_closed:
            answered.append(True)
    finally:
        if answered or channel is None:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()
        else:
            abandon(connection, f"no answer to a consume on {queue!r} within {timeout:g} s")
    return bool(answered)
