"""One Spark partition's scheduled rows: produced to the delay scheduler's input topic.

The same conventions as ``switchyard delay send``: an idempotent producer (``enable.idempotence``,
``acks=all``; ``service.delay_producer`` makes it), the Chronos headers ``chronosMessageId`` (the
row's id) and ``chronosDeadline`` (canonical UTC), and here the pool, key and id in headers too
(``x-switchyard-pool``, ``x-switchyard-key``, ``x-switchyard-id``, and the row's ``traceparent``,
which the scheduler relays); the
Kafka key is the row's key, the value its body. A row is ``scheduled`` once the broker confirmed
it, ``failed`` (retried by ``--resume``) if not.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import cast

from switchyard.core.tracing import TRACEPARENT_HEADER
from switchyard.delay.parsing import parse_deadline
from switchyard.delay.settings import validate_topic
from switchyard.rpc.scheduling import ScheduledCall, scheduled_headers
from switchyard.spark.ports import ConnectProducer
from switchyard.spark.rows import Request, Status, result_row


def chronos_headers(request: Request, reply_queue: str | None = None) -> list[tuple[str, bytes]]:
    """The headers a scheduled row carries (``request.deadline`` must be set): a scheduled call's
    (switchyard/rpc/scheduling.py), answered into ``reply_queue`` if one is named."""
    trace = ((TRACEPARENT_HEADER, request.traceparent.encode()),) if request.traceparent else ()
    call = ScheduledCall(request.id, request.pool, request.key, request.body, reply_queue, headers=trace)
    return scheduled_headers(call, parse_deadline(cast(str, request.deadline)))


def schedule_partition(
    requests: Iterable[Request],
    connect: ConnectProducer,
    topic: str,
    timeout_s: float = 30.0,
    on_result: Callable[[tuple], None] | None = None,
    reply_queue: str | None = None,
) -> Iterator[tuple]:
    """Produce every request to ``topic`` with ``connect()``'s producer (made for the first row);
    yield one results row each once the broker confirmed (or refused) it. ``reply_queue``: the
    durable reply queue their answers go to (``--reply-queue``), None: no answer kept."""
    topic = validate_topic(topic)
    requests = iter(requests)
    first = next(requests, None)
    if first is None:  # most partitions hold no scheduled row: no producer, no connection
        return
    producer = connect()
    finished: list[tuple] = []
    pending: dict[int, Request] = {}

    def delivered(seq: int, started: float, err: object) -> None:
        request = pending.pop(seq)
        latency = round((time.monotonic() - started) * 1000, 3)
        status, error = (Status.FAILED, f"Kafka: {err}") if err is not None else (Status.SCHEDULED, None)
        row = result_row(request, status, 1, latency, None, error)
        if on_result is not None:
            on_result(row)
        finished.append(row)

    for seq, request in enumerate(itertools.chain([first], requests)):
        started = time.monotonic()
        pending[seq] = request
        while True:
            try:
                producer.produce(topic, key=request.key.encode(), value=request.body,
                                 headers=chronos_headers(request, reply_queue),
                                 # mypy cannot type a lambda whose defaults bind the loop's values
                                 on_delivery=lambda err, _msg, n=seq, t=started: delivered(n, t, err))  # type: ignore[misc]
                break
            except BufferError:  # the local queue is full: serve confirmations, then try again
                producer.poll(0.1)
        producer.poll(0)
        if finished:
            yield from finished
            finished.clear()
    producer.flush(timeout_s + 5)
    yield from finished
    for request in pending.values():  # never confirmed nor refused in time: not known to be there
        row = result_row(request, Status.FAILED, 1, None, None, "Kafka: no delivery report in time")
        if on_result is not None:
            on_result(row)
        yield row
