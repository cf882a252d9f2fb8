"""The baseline: a plain pika RPC worker and direct-reply-to client, as a competent user would
write them without Switchyard. Used by rpc_bench.py; run ``python bench/plain_pika.py worker QUEUE``
to start the worker alone.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
import uuid

import pika


def connect(amqp_url: str) -> pika.BlockingConnection:
    """A connection to one of a comma-separated list of nodes (one URL: that one), taken at random as
    a user spreading connections over a cluster would (pika tries the others in turn)."""
    urls = [url.strip() for url in amqp_url.split(",") if url.strip()]
    return pika.BlockingConnection([pika.URLParameters(url) for url in random.sample(urls, len(urls))])


def run_worker(amqp_url: str, queue: str, prefetch: int) -> None:
    connection = connect(amqp_url)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)

    def on_request(ch, method, props, body):
        ch.basic_publish("", props.reply_to, body,
                         pika.BasicProperties(correlation_id=props.correlation_id))
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_request)
    with contextlib.suppress(KeyboardInterrupt):
        channel.start_consuming()


class PlainClient:
    """Direct reply-to, correlation ids in a dict, one thread: the usual pika RPC client."""

    def __init__(self, amqp_url: str, queue: str) -> None:
        self.connection = connect(amqp_url)
        self.channel = self.connection.channel()
        self.queue = queue
        self.pending: dict[str, float] = {}
        self.latencies: list[float] = []
        self.on_done = None
        self.channel.basic_consume("amq.rabbitmq.reply-to", self._on_response, auto_ack=True)

    def _on_response(self, _ch, _method, props, _body) -> None:
        sent = self.pending.pop(props.correlation_id, None)
        if sent is not None:
            self.latencies.append(time.perf_counter() - sent)
            if self.on_done is not None:
                self.on_done()

    def publish(self, body: bytes = b"x") -> None:
        cid = uuid.uuid4().hex
        self.pending[cid] = time.perf_counter()
        self.channel.basic_publish("", self.queue, body,
                                   pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=cid))

    def sequential(self, seconds: float) -> None:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            self.publish()
            while self.pending:
                self.connection.process_data_events(time_limit=None)

    def pipelined(self, seconds: float, in_flight: int) -> None:
        deadline = time.perf_counter() + seconds

        def next_call() -> None:
            if time.perf_counter() < deadline:
                self.publish()

        self.on_done = next_call
        for _ in range(in_flight):
            self.publish()
        while self.pending:
            self.connection.process_data_events(time_limit=None)
        self.on_done = None

    def close(self) -> None:
        self.connection.close()


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "worker":
        sys.exit("usage: plain_pika.py worker QUEUE [PREFETCH] [AMQP_URL]")
    run_worker(sys.argv[4] if len(sys.argv) > 4 else "amqp://guest:guest@127.0.0.1:5672/%2F",
               sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 4)
