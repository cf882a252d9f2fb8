"""The worker runtime: the keyed RPC design's worker protocol around a user handler.

A handler is ``handler(request: Request) -> bytes | str | None``. It may raise ``Requeue`` to
hand the request back; any other exception becomes a negative response (status ``error``, a JSON
body naming the error) so the caller's slot frees at once.

Threads. The thread that runs ``run()`` takes requests, runs the handler outside pika's callbacks
and publishes its reply: a request costs no hand-off between threads (each one cost a wake-up on
both sides and the CPU's attention on a busy machine). A keeper thread watches the handler: once
one has run for ``_TAKEOVER_S`` it drives the connection's I/O (heartbeats included, and requests
arriving meanwhile, which wait their turn) until the handler returns, so a handler may run however
long. One lock orders the two threads' use of the connection (pika is not thread-safe; it never
sees two threads at once). The heartbeat is ``SWITCHYARD_AMQP_HEARTBEAT_S``. Requests are handled
one at a time, in order.

Replies go through the default exchange to ``reply-to`` with the request's correlation id and
``x-status``, and the request is acked after, on the same channel: a few answered requests at a
time with one multiple ack, an idle worker's within ``WORKER_ACK_DELAY_MS`` (5 ms; ``acks``).
The broker handles a channel's frames in order, so the reply is routed before the ack takes
effect, and a crash anywhere before the ack redelivers the request (at-least-once). Waiting for a
publisher confirm of the reply would add a round trip per request and protect nothing more:
replies go to transient reply queues that a broker restart loses anyway.

``Requeue`` is not a ``basic.reject``: quorum queues count a requeue as a delivery (3.10 and 4.x
alike), so a worker shedding load would turn healthy requests into ``delivery_limit`` poison. The
request is republished to its own queue instead (same body, properties and headers; its remaining
expiration kept in ``x-switchyard-deadline-ms``), on a second channel with publisher confirms,
and acked only once the broker confirmed the copy (a nack falls back to a reject). A request shed
after its deadline is rejected without requeue (dead-lettered as ``rejected``). A crash still
counts: the unacked request returns to the queue with its delivery count raised. On SIGTERM the
request in hand is finished and answered, and prefetched ones are shed the same way.

A worker may start before its request queue exists: the orphan handler marks a new key active and
then declares its queue, and the group can be started in between (by the reconciler, which reads
the state); on a loaded machine the worker's consume comes first. It waits for the queue, up to
``WORKER_QUEUE_WAIT`` seconds (default 30), then fails with ``TopologyError`` (exit 1). A consume
that meets the queue while the broker is still creating it may cost the worker its connection
(``INTERNAL_ERROR``); within the wait it connects again.

Activity reports (``started``, ``request-received``) go to the pool's activity exchange, with the
worker key as routing key; ``request-received`` is sent at most once per activity interval
(0 sends one per request), which is all the activity tracker needs. It carries the latency of the
requests answered since the previous report (``x-switchyard-latency``: from a request's delivery to
this worker to its reply), which the tracker keeps for ``switchyard status``; measuring it costs a
clock read and a list write per request, under the lock the reply already holds; no extra message.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pika
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from switchyard.core import tracing
from switchyard.core.latency import LatencySamples
from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.amqp import (
    LoopPasses,
    ack_buffered,
    cancel_direct,
    connect,
    consume_direct,
    enable_async_confirms,
    publish_buffered,
    reject_buffered,
    url_parameters,
    wake_threadsafe,
    written_together,
)
from switchyard.rpc.amqp_decode import undecodable
from switchyard.rpc.control.access import BrokerRole, BrokerUser
from switchyard.rpc.errors import TopologyError
from switchyard.rpc.settings import RpcSettings
from switchyard.rpc.worker.acks import AckBatch, batch_size
from switchyard.rpc.worker.copies import bypassed, handler_headers, poison_properties, shed_properties
from switchyard.rpc.worker.request import (
    Handler,
    Request,
    Requeue,
    WorkerConfig,
    WorkerStats,
    load_handler,
)


@dataclass(frozen=True, slots=True)
class _Delivery:
    tag: int
    props: pika.BasicProperties
    body: bytes
    redelivered: bool
    received_ms: int  # epoch ms, the start of the remaining-expiration clock
    received_s: float  # monotonic, the start of the latency clock
    exchange: str  # what it was published to ("": straight into the queue)


LATENCY_SAMPLES = 4096  # answered requests a report summarizes at most (the most recent)
_TAKEOVER_S = 0.5  # a handler running this long gets the keeper driving the connection's I/O
_KEEPER_PUMP_S = 0.1  # the keeper's I/O turn: it releases the connection between turns
_IDLE_PASS_S = 0.5  # the longest an idle worker waits in one pass (it checks for SIGTERM between)
_QUEUE_POLL_S = 0.2  # between consumes of a request queue not declared yet


class Worker:
    """Consumes one request queue and answers each request. ``run()`` blocks until stopped."""

    def __init__(self, handler: Handler, config: WorkerConfig, settings: RpcSettings | None = None,
                 connection: pika.BlockingConnection | None = None) -> None:
        self.handler = handler
        self.config = config
        self.settings = settings or RpcSettings.from_env()
        # Who this worker is on the broker: its shed copies carry it as their checked ``user_id``.
        self._user = url_parameters(self.settings.connections.amqp_url).credentials.username
        self._forwarder = BrokerUser(BrokerRole.ORPHANS, config.pool).username  # its forwards' user_id
        self.stats = WorkerStats()
        self._stopping = False
        self.consuming = False  # from the consume-ok until the worker stops taking requests
        self._last_activity = float("-inf")
        self._connection = connection  # a spare's, opened ahead (``spare``); else opened by ``run``
        self._channel: BlockingChannel | None = None
        self._shed_channel: BlockingChannel | None = None
        # Answered requests' acks, on ``_channel``.
        self._acks = AckBatch(batch_size(config.prefetch, config.ack_delay_ms), config.ack_delay_ms / 1000)
        self._shed_seq = 0
        self._unconfirmed_sheds: dict[int, int] = {}  # shed channel publish seq -> delivery tag
        self._inbox: deque[_Delivery] = deque()  # delivered, not handled yet (in order)
        self._io_lock = threading.Lock()  # held by the thread using the connection
        self._running: tuple[int, float] | None = None  # (handler run number, its start), for the keeper
        self._runs = 0
        self._keeper_driving = False
        self._keeper_error: BaseException | None = None
        self._done = False
        # Latencies (ms) of the requests answered since the last report; used under the I/O lock.
        self._latencies = LatencySamples(LATENCY_SAMPLES)

    def stop(self) -> None:
        """Finish the request in hand, then return from ``run()`` (safe from a signal handler)."""
        self._stopping = True

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def run(self) -> None:
        cfg = self.config
        opened = self._open()
        if opened is None:
            return  # stopped while waiting for the queue: nothing was taken
        connection, channel, tag = opened
        keeper = threading.Thread(target=self._keep_io, args=(connection,), name="switchyard-io-keeper",
                                  daemon=True)
        try:
            self.consuming = True
            keeper.start()
            logger.info("worker started", extra={"worker_id": cfg.worker_id, "pool": cfg.pool,
                                                 "queue": cfg.requests_queue})
            passes = LoopPasses(connection)
            while not self._stopping:
                self._handle_inbox(connection)
                with self._io_lock:
                    if self._inbox:
                        connection.process_data_events(time_limit=0)
                    else:
                        passes.run(min(time.monotonic() + _IDLE_PASS_S, self._acks.due))
                    if self._acks.due <= time.monotonic():
                        with written_together(connection):
                            self._acks.flush(channel)
            # SIGTERM: the request in hand was finished and answered; stop taking requests, shed
            # those prefetched but not started, wait for the confirms.
            with self._io_lock:
                self._acks.flush(channel)
                connection.process_data_events(time_limit=0)  # dispatch what arrived (to the inbox)
                cancel_direct(channel, tag)
                self.consuming = False
                self._shed_waiting()
                while self._unconfirmed_sheds:
                    connection.process_data_events(time_limit=0.2)
            logger.info("worker stopped", extra={"worker_id": cfg.worker_id, **vars(self.stats)})
        finally:
            self.consuming = False
            self._done = True
            if keeper.is_alive():
                keeper.join(2 * _KEEPER_PUMP_S + 1)
            if connection.is_open:
                connection.close()

    def _open(self) -> tuple[pika.BlockingConnection, BlockingChannel, str] | None:
        """Connect and consume the request queue (None: stopped while waiting for it).

        A consume that meets a quorum queue while the broker is still creating it can crash the
        broker's channel process, and the broker then closes the whole connection with
        ``INTERNAL_ERROR`` (3.10 and 4.0 alike: 4 and 11 races in 30 here, consumes 2 ms apart).
        Within the queue wait that is a reason to connect again, not to exit."""
        cfg = self.config
        deadline = time.monotonic() + cfg.queue_wait
        while True:
            connection = self._connection
            if connection is None or not connection.is_open:
                connection = connect(self.settings.connections.amqp_url, f"switchyard-worker-{cfg.worker_id}")
            self._connection = connection
            consuming = None
            try:
                self._shed_channel = connection.channel()
                enable_async_confirms(self._shed_channel, self._on_shed_confirm)
                consuming = self._consume(connection, deadline)
            except pika.exceptions.ConnectionClosedByBroker as exc:
                if (exc.reply_code != protocol.INTERNAL_ERROR or time.monotonic() >= deadline
                        or self._stopping):
                    raise
                self.stats.queue_races += 1
                logger.warning("the broker closed the connection on a consume (INTERNAL_ERROR: the request "
                               "queue was being created); connecting again",
                               extra={"worker_id": cfg.worker_id, "queue": cfg.requests_queue})
                continue
            finally:
                if consuming is None and connection.is_open:
                    connection.close()
            return None if consuming is None else (connection, *consuming)

    def _consume(self, connection: pika.BlockingConnection,
                 deadline: float) -> tuple[BlockingChannel, str] | None:
        """Report ``started`` and consume the request queue, waiting for it until ``deadline`` if it
        is not declared yet (None: stopped while waiting)."""
        cfg = self.config
        while True:
            channel = connection.channel()
            self._channel = channel
            channel.basic_qos(prefetch_count=cfg.prefetch)
            if not self.stats.waited_for_queue:
                self._report(protocol.Event.STARTED)
            try:
                return channel, consume_direct(channel, cfg.requests_queue, self._on_request,
                                               on_cancel=self._on_queue_deleted)
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != protocol.NOT_FOUND:
                    raise
                if self._stopping:
                    return None
                if time.monotonic() >= deadline:
                    raise TopologyError(
                        f"request queue {cfg.requests_queue!r} does not exist (waited {cfg.queue_wait:g} s); "
                        "it is created by the orphan handler, or by `switchyard pool bind`"
                    ) from exc
            if not self.stats.waited_for_queue:
                logger.info("request queue not declared yet; waiting for it",
                            extra={"worker_id": cfg.worker_id, "queue": cfg.requests_queue})
            self.stats.waited_for_queue += 1
            connection.sleep(_QUEUE_POLL_S)  # keeps the connection's I/O (heartbeats) going

    # -- I/O thread -------------------------------------------------------------------------
    def _on_request(self, _channel: BlockingChannel, method: pika.spec.Basic.Deliver,
                    props: pika.BasicProperties, body: bytes) -> None:
        now = time.monotonic()
        if now - self._last_activity >= self.config.activity_interval:
            self._report(protocol.Event.REQUEST_RECEIVED)
            self._last_activity = now
        self._inbox.append(_Delivery(method.delivery_tag, props, body, method.redelivered,
                                     int(time.time() * 1000), now, method.exchange))

    def _on_queue_deleted(self) -> None:
        """The broker cancelled the consumer: the request queue was deleted (the group's key was
        retired). Nothing more can come; what was delivered is finished, then the worker stops."""
        logger.warning("request queue deleted; stopping", extra={"worker_id": self.config.worker_id,
                                                                 "queue": self.config.requests_queue})
        self.stats.queue_deleted = True
        self.stop()

    def _handle_inbox(self, connection: pika.BlockingConnection) -> None:
        """Run the handler on each delivered request, then reply (sent at once, with its batch's
        ack when due). Stops at SIGTERM: the rest is shed."""
        while self._inbox and not self._stopping:
            delivery = self._inbox.popleft()
            if (reason := undecodable(delivery.props.headers)) is not None:
                with self._io_lock, written_together(connection):
                    self._poison(delivery, reason, "UndecodableHeaders")
                continue
            if (reason := bypassed(delivery.exchange, delivery.props.user_id, self._user,
                                   self.config.requests_queue)) is not None:
                with self._io_lock, written_together(connection):
                    self._poison(delivery, reason, None)
                continue
            self._runs += 1
            self._running = (self._runs, time.monotonic())
            try:
                context, status, reply_body, took_ms = self._handle(delivery)
            finally:
                self._running = None
            # Written before the reply: a caller holding its answer finds the hop in the trace log.
            tracing.hop(context, "rpc", "handled", duration_ms=took_ms, pool=self.config.pool,
                        key=self.config.key, worker_id=self.config.worker_id,
                        status=status.value if status is not None else "requeued")
            if self._keeper_driving:  # end its I/O turn now rather than at its time limit
                with contextlib.suppress(pika.exceptions.ConnectionWrongStateError):
                    wake_threadsafe(connection, lambda: None)
            with self._io_lock:
                if self._keeper_error is not None:
                    raise self._keeper_error
                with written_together(connection):  # sent now, not at the loop's next pass
                    answered = self._finish(delivery, status, reply_body, context.traceparent)
                # The bookkeeping comes after the send: the caller's wait does not include it.
                if answered:
                    self._latencies.add((time.monotonic() - delivery.received_s) * 1000)

    def _keep_io(self, connection: pika.BlockingConnection) -> None:
        """Keeper thread: while a handler runs longer than ``_TAKEOVER_S``, drive the I/O.

        It polls (a few wake-ups a second, only while the worker runs) instead of being told of
        each request: telling it would cost the wake-up per request this design saves.
        """
        while not self._done:
            time.sleep(_TAKEOVER_S / 2)
            running = self._running
            if running is None or time.monotonic() - running[1] < _TAKEOVER_S:
                continue
            try:
                while self._running == running and not self._done:
                    with self._io_lock:
                        if self._running != running:
                            break
                        self._keeper_driving = True
                        try:
                            self._acks.flush(self._channel)  # sent by the turn below
                            connection.process_data_events(time_limit=_KEEPER_PUMP_S)
                        finally:
                            self._keeper_driving = False
            except Exception as exc:  # the connection failed: the worker raises it after the handler
                self._keeper_error = exc
                return

    def _finish(self, delivery: _Delivery, status: protocol.Status | None, reply_body: bytes,
                traceparent: str) -> bool:
        """Publish the handler's reply (with the handling's ``traceparent``) and ack, or shed the
        request (``status`` None). Whether a reply was sent."""
        if status is None:
            self._shed(delivery)
            return False
        if not protocol.replyable(delivery.props.reply_to):  # none, or a queue no answer may go to
            self.stats.no_reply_to += 1
            self._ack(delivery.tag)
            return False
        self._reply(delivery.props, status, reply_body, traceparent)
        self._ack(delivery.tag)
        return True

    def _reply(self, props: pika.BasicProperties, status: protocol.Status, reply_body: bytes,
               traceparent: str) -> None:
        headers = {protocol.STATUS_HEADER: status.value, protocol.WORKER_ID_HEADER: self.config.worker_id,
                   tracing.TRACEPARENT_HEADER: traceparent}
        if props.headers and tracing.TRACESTATE_HEADER in props.headers:  # vendors' state, passed through
            headers[tracing.TRACESTATE_HEADER] = props.headers[tracing.TRACESTATE_HEADER]
        # An answer to a durable reply queue (a scheduled call's) is persistent: it outlives a broker
        # restart as the queue does; a caller's own reply queue dies with the caller anyway.
        persistent = props.reply_to.startswith(protocol.REPLY_QUEUE_PREFIX)
        reply_props = pika.BasicProperties(correlation_id=props.correlation_id, headers=headers,
                                           delivery_mode=pika.DeliveryMode.Persistent if persistent else None)
        # The reply goes out before the ack (with it or in a later batch): a channel's frames are
        # handled in order, so the reply is routed before the request is settled.
        publish_buffered(self._channel, "", props.reply_to, reply_body, reply_props)

    def _poison(self, delivery: _Delivery, reason: str, error: str | None) -> None:
        """A request the worker will not serve: answered ``error`` (``error`` names why; None: not
        answered), and copied to the pool's poison inventory with its reason, the original settled as
        a shed's (when the copy is confirmed)."""
        self.stats.poisoned += 1
        props = delivery.props
        logger.error("request sent to the poison inventory",
                     extra={"worker_id": self.config.worker_id, "amqp_correlation_id": props.correlation_id,
                            "reason": reason})
        self._acks.flush(self._channel)  # before this request is settled otherwise (see acks)
        if error is not None and protocol.replyable(props.reply_to):
            detail = {"error": error, "message": reason}
            trace = tracing.from_headers(None)  # the request's own traceparent is in the undecoded table
            self._reply(props, protocol.Status.ERROR, json.dumps(detail).encode(), trace.traceparent)
        self._publish_confirmed(delivery.tag, protocol.poison_queue(self.config.pool), delivery.body,
                                poison_properties(props, reason))

    def _ack(self, tag: int) -> None:
        """Ack an answered request: with its batch, or alone while a shed request is unconfirmed
        (a multiple ack would settle that request's original too)."""
        if self._unconfirmed_sheds:
            ack_buffered(self._channel, tag)
        else:
            self._acks.add(self._channel, tag, time.monotonic(), waiting=bool(self._inbox))

    def _latency_summary(self) -> str | None:
        """``count p50 p99 max`` of the requests answered since the last call (None: none)."""
        taken = self._latencies.take()
        if taken is None:
            return None
        return f"{taken.count} {taken.p50_ms:.3f} {taken.p99_ms:.3f} {taken.max_ms:.3f}"

    def _shed(self, delivery: _Delivery) -> None:
        """Republish to the request's own queue; the original is acked when the copy is confirmed."""
        self._acks.flush(self._channel)  # before this request is settled otherwise (see acks)
        props = shed_properties(delivery.props, delivery.received_ms, int(time.time() * 1000), self._user)
        if props.expiration == "0":
            # Past its deadline: a copy with expiration 0 would go straight back to a ready
            # consumer. Dead-letter it instead (reason ``rejected``; nobody waits for it anymore).
            reject_buffered(self._channel, delivery.tag, requeue=False)
            return
        self._publish_confirmed(delivery.tag, self.config.requests_queue, delivery.body, props)

    def _publish_confirmed(self, tag: int, queue: str, body: bytes, props: pika.BasicProperties) -> None:
        """A copy of delivery ``tag`` into ``queue`` on the confirmed channel, acked on its confirm."""
        self._shed_seq += 1
        self._unconfirmed_sheds[self._shed_seq] = tag
        publish_buffered(self._shed_channel, "", queue, body, props)

    def _shed_waiting(self) -> None:
        while self._inbox:
            self._shed(self._inbox.popleft())

    def _on_shed_confirm(self, frame: pika.frame.Method) -> None:
        method = frame.method
        seqs = ([s for s in self._unconfirmed_sheds if s <= method.delivery_tag]
                if method.multiple else [method.delivery_tag])
        nack = isinstance(method, pika.spec.Basic.Nack)
        for seq in seqs:
            tag = self._unconfirmed_sheds.pop(seq, None)
            if tag is None:
                continue
            if nack:  # the copy was not stored: give the original back (this one counts)
                reject_buffered(self._channel, tag, requeue=True)
            else:
                ack_buffered(self._channel, tag)

    def _report(self, event: protocol.Event) -> None:
        headers = {protocol.EVENT_HEADER: event.value, protocol.WORKER_ID_HEADER: self.config.worker_id,
                   protocol.KEY_HEADER: self.config.key}
        if event is protocol.Event.REQUEST_RECEIVED and (latency := self._latency_summary()) is not None:
            headers[protocol.LATENCY_HEADER] = latency
        props = pika.BasicProperties(headers=headers, timestamp=int(time.time()))
        publish_buffered(self._channel, self.config.activity_exchange, protocol.routing_key(self.config.key),
                         b"", props)

    # -- the handler ------------------------------------------------------------------------
    def _handle(self, delivery: _Delivery
                ) -> tuple[tracing.TraceContext, protocol.Status | None, bytes, float]:
        """The handler's outcome under the request's trace (its id the logger's correlation id),
        with that trace's context and the handler's time in ms."""
        context = tracing.from_headers(delivery.props.headers)
        started = time.perf_counter()
        with tracing.scope(context):
            status, body = self._run_handler(delivery)
        return context, status, body, (time.perf_counter() - started) * 1000

    def _run_handler(self, delivery: _Delivery) -> tuple[protocol.Status | None, bytes]:
        cfg = self.config
        props = delivery.props
        request = Request(
            key=cfg.key,
            body=delivery.body,
            correlation_id=props.correlation_id,
            reply_to=props.reply_to,
            headers=handler_headers(props, delivery.exchange == "", self._forwarder),
            redelivered=delivery.redelivered,
            worker_id=cfg.worker_id,
        )
        try:
            reply_body = protocol.body_bytes(self.handler(request),
                                             "a handler must return bytes, str or None")
        except Requeue:
            self.stats.requeued += 1
            return None, b""
        except Exception as exc:
            self.stats.errors += 1
            self.stats.handled += 1
            logger.exception("handler failed", extra={"worker_id": cfg.worker_id,
                                                      "amqp_correlation_id": props.correlation_id})
            return (protocol.Status.ERROR,
                    json.dumps({"error": type(exc).__name__, "message": str(exc)}).encode())
        self.stats.handled += 1
        return protocol.Status.OK, reply_body


def run_worker(handler_spec: str, settings: RpcSettings | None = None,
               env: Mapping[str, str] | None = None,
               announce: Callable[[WorkerConfig, RpcSettings], None] | None = None) -> WorkerStats:
    """Entry point of ``switchyard worker``: configure from the worker protocol's variables (``env``,
    default the process environment) and serve until SIGTERM. ``announce``: called once the handler
    is loaded and the configuration read, before the first connection (the command's start line)."""
    settings = settings or RpcSettings.from_env()
    worker = Worker(load_handler(handler_spec), WorkerConfig.from_env(settings, env), settings)
    if announce is not None:
        announce(worker.config, settings)
    worker.install_signal_handlers()
    worker.run()
    return worker.stats
