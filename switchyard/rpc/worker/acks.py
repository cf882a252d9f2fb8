"""Acks of answered requests, sent a few at a time: one ``basic.ack`` with ``multiple`` per batch.

On a quorum queue every ack is a Raft command the broker writes to its log before it settles the
message; sent with the reply, it also queues on that log ahead of the caller's next request. Fewer
acks, sent off that path, are worth 1.10-1.13x the sequential calls per second (a plain pika worker
acking every 2nd or 3rd request against one acking each, RabbitMQ 3.10; docs/benchmarks.md). But a
held ack holds prefetch room, which starves a worker while requests queue, so ``add`` batches by
what the worker sees (runs, or calls one at a time), and an idle worker sends a batch at ``due``
(a handler running then delays it until it returns, or until the keeper thread takes over the
connection at 0.5 s). A crash before a batch is sent redelivers its requests: work done twice,
as at-least-once allows, never lost.

A multiple ack settles every delivery up to its tag, so the worker flushes the batch before it
settles a request any other way (a shed, a reject), and sends acks one by one while a shed
request waits for its copy's confirm (its original must stay unacked until then).
"""

from __future__ import annotations

import math

from pika.adapters.blocking_connection import BlockingChannel

from switchyard.rpc.amqp import ack_buffered

STREAM_MEMORY_S = 0.1  # requests waited this recently: they come in runs, not one at a time


def batch_size(prefetch: int, delay_ms: float) -> int:
    """One less than the prefetch: the broker can always deliver the next request. With a
    prefetch under 3, or no delay, each request is acked at once."""
    return max(1, prefetch - 1) if delay_ms > 0 else 1


class AckBatch:
    """The answered, unacked deliveries of one channel (used under the worker's I/O lock)."""

    def __init__(self, size: int, delay: float) -> None:
        self.size = size
        self.delay = delay
        self.due = math.inf  # when the oldest unacked answer must be acked (monotonic)
        self._tag = 0  # the newest answered delivery not acked yet
        self._count = 0
        self._streamed_at = -math.inf  # when an answer last found other requests waiting

    def add(self, channel: BlockingChannel, tag: int, now: float, waiting: bool) -> None:
        """An answered delivery, ``waiting``: whether other requests wait in the worker.

        Its ack goes with the batch: at the run's last answer when requests came in a run (the
        broker refills the prefetch window once); when they come one at a time (no run for
        ``STREAM_MEMORY_S``), once ``size`` are answered; and at ``due`` at the latest.
        """
        self._tag = tag
        self._count += 1
        if self._count == 1:
            self.due = now + self.delay
        if waiting:
            self._streamed_at = now
        if self._count >= self.size or now >= self.due or \
                (not waiting and now - self._streamed_at < STREAM_MEMORY_S):
            self.flush(channel)

    def flush(self, channel: BlockingChannel) -> None:
        """Ack what is waiting (written with the frames around it)."""
        if self._count:
            ack_buffered(channel, self._tag, multiple=self._count > 1)
            self._tag = self._count = 0
            self.due = math.inf

    def __len__(self) -> int:
        return self._count
