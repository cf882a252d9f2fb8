"""The worker runtime: seed 000's worker protocol around a user handler.

A handler is ``handler(request: Request) -> bytes | str | None``. It may raise ``Requeue`` to
hand the request back (``basic.reject`` with requeue); any other exception becomes a negative
response (status ``error``, a JSON body naming the error) so the caller's slot frees at once.

Replies go through the default exchange to ``reply-to`` with the request's correlation id and
``x-status``, and the request is acked right after, on the same channel. The broker handles a
channel's frames in order, so the reply is routed before the ack takes effect, and a crash
anywhere before the ack redelivers the request (at-least-once). Waiting for a publisher confirm
of the reply would add a round trip per request and protect nothing more: replies go to
transient reply queues that a broker restart loses anyway.
Activity reports (``started``, ``request-received``) go to the pool's activity exchange, with the
worker key as routing key; ``request-received`` is sent at most once per activity interval
(0 sends one per request), which is all the activity tracker needs.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from switchyard.errors import ConfigError, TopologyError
from switchyard.observability import logger
from switchyard.rpc import protocol as p
from switchyard.rpc.amqp import ack_buffered, connect, publish_buffered
from switchyard.rpc.settings import RpcSettings
from switchyard.rpc.topology import NOT_FOUND


class Requeue(Exception):
    """Raise from a handler to give the request back to the queue for another worker."""


@dataclass(frozen=True, slots=True)
class Request:
    key: str
    body: bytes
    correlation_id: str | None
    reply_to: str | None
    headers: Mapping[str, Any]
    redelivered: bool
    worker_id: str

    @property
    def delivery_count(self) -> int:
        """How many times the broker delivered this request before (quorum queues)."""
        return int(self.headers.get(p.DELIVERY_COUNT_HEADER, 0) or 0)

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


Handler = Callable[[Request], "bytes | str | None"]


@dataclass(frozen=True)
class WorkerConfig:
    """The worker protocol's environment (seed 000, "Worker protocol")."""

    worker_id: str
    key: str
    pool: str
    requests_queue: str
    activity_exchange: str
    prefetch: int = 4
    activity_interval: float = 1.0

    @classmethod
    def from_env(
        cls, settings: RpcSettings | None = None, env: Mapping[str, str] | None = None
    ) -> WorkerConfig:
        env = os.environ if env is None else env
        settings = settings or RpcSettings.from_env()
        pool = env.get("WORKER_POOL")
        key = env.get("WORKER_KEY")
        if pool is None or key is None:
            raise ConfigError("WORKER_POOL and WORKER_KEY must be set (the worker group driver sets them)")
        return cls(
            worker_id=env.get("WORKER_ID") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
            key=key,
            pool=p.validate_pool(pool),
            requests_queue=env.get("WORKER_REQUESTS_QUEUE") or p.request_queue(pool, key),
            activity_exchange=env.get("WORKER_ACTIVITY_EXCHANGE") or p.activity_exchange(pool),
            prefetch=int(env.get("WORKER_PREFETCH") or settings.worker_prefetch),
            activity_interval=float(env.get("WORKER_ACTIVITY_INTERVAL") or settings.activity_interval),
        )


@dataclass
class WorkerStats:
    handled: int = 0
    errors: int = 0
    requeued: int = 0
    no_reply_to: int = 0


def load_handler(spec: str) -> Handler:
    """Import ``module:function``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"handler must look like module:function, got {spec!r}")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load handler {spec!r}: {exc}") from exc
    if not callable(target):
        raise ConfigError(f"handler {spec!r} is not callable")
    return target


def _encode_result(result: bytes | str | None) -> bytes:
    if result is None:
        return b""
    if isinstance(result, str):
        return result.encode("utf-8")
    if isinstance(result, bytes | bytearray | memoryview):
        return bytes(result)
    raise TypeError(f"a handler must return bytes, str or None, not {type(result).__name__}")


class Worker:
    """Consumes one request queue and answers each request. ``run()`` blocks until stopped."""

    def __init__(self, handler: Handler, config: WorkerConfig, settings: RpcSettings | None = None) -> None:
        self.handler = handler
        self.config = config
        self.settings = settings or RpcSettings.from_env()
        self.stats = WorkerStats()
        self._stopping = False
        self._last_activity = float("-inf")
        self._channel: BlockingChannel | None = None

    def stop(self) -> None:
        """Finish the request in hand, then return from ``run()`` (safe from a signal handler)."""
        self._stopping = True

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def run(self) -> None:
        cfg = self.config
        connection = connect(self.settings.connections.amqp_url, f"switchyard-worker-{cfg.worker_id}")
        try:
            channel = connection.channel()
            self._channel = channel
            channel.basic_qos(prefetch_count=cfg.prefetch)
            self._report(p.Event.STARTED)
            try:
                tag = channel.basic_consume(cfg.requests_queue, self._on_request)
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code == NOT_FOUND:
                    raise TopologyError(
                        f"request queue {cfg.requests_queue!r} does not exist; it is created by the "
                        "orphan handler, or by `switchyard pool bind`"
                    ) from exc
                raise
            logger.info("worker started", extra={"worker_id": cfg.worker_id, "pool": cfg.pool,
                                                 "queue": cfg.requests_queue})
            while not self._stopping:
                connection.process_data_events(time_limit=0.5)
            # SIGTERM: stop taking requests; pika nacks (requeues) those prefetched but not started.
            channel.basic_cancel(tag)
            logger.info("worker stopped", extra={"worker_id": cfg.worker_id, **vars(self.stats)})
        finally:
            if connection.is_open:
                connection.close()

    # -- per request ------------------------------------------------------------------------
    def _on_request(self, channel: BlockingChannel, method: pika.spec.Basic.Deliver,
                    props: pika.BasicProperties, body: bytes) -> None:
        cfg = self.config
        now = time.monotonic()
        if now - self._last_activity >= cfg.activity_interval:
            self._report(p.Event.REQUEST_RECEIVED)
            self._last_activity = now
        headers = props.headers or {}
        request = Request(
            key=cfg.key,
            body=body,
            correlation_id=props.correlation_id,
            reply_to=props.reply_to,
            headers=headers,
            redelivered=method.redelivered,
            worker_id=cfg.worker_id,
        )
        try:
            reply_body = _encode_result(self.handler(request))
            status = p.Status.OK
        except Requeue:
            self.stats.requeued += 1
            channel.basic_reject(method.delivery_tag, requeue=True)
            return
        except Exception as exc:
            self.stats.errors += 1
            logger.exception("handler failed", extra={"worker_id": cfg.worker_id,
                                                      "correlation_id": props.correlation_id})
            reply_body = json.dumps({"error": type(exc).__name__, "message": str(exc)}).encode()
            status = p.Status.ERROR
        self.stats.handled += 1
        if not props.reply_to:
            self.stats.no_reply_to += 1
            ack_buffered(channel, method.delivery_tag)
            return
        reply_props = pika.BasicProperties(
            correlation_id=props.correlation_id,
            headers={p.STATUS_HEADER: status.value, p.WORKER_ID_HEADER: cfg.worker_id},
        )
        # Both frames go out together when this callback returns to the I/O loop, in this order.
        publish_buffered(channel, "", props.reply_to, reply_body, reply_props)
        ack_buffered(channel, method.delivery_tag)

    def _report(self, event: p.Event) -> None:
        props = pika.BasicProperties(
            headers={p.EVENT_HEADER: event.value, p.WORKER_ID_HEADER: self.config.worker_id,
                     p.KEY_HEADER: self.config.key},
            timestamp=int(time.time()),
        )
        publish_buffered(self._channel, self.config.activity_exchange, p.routing_key(self.config.key),
                         b"", props)


def run_worker(handler_spec: str, settings: RpcSettings | None = None) -> WorkerStats:
    """Entry point of ``switchyard worker``: configure from the environment and serve until SIGTERM."""
    settings = settings or RpcSettings.from_env()
    worker = Worker(load_handler(handler_spec), WorkerConfig.from_env(settings), settings)
    worker.install_signal_handlers()
    worker.run()
    return worker.stats
