"""A worker written to the letter of seed 000's worker protocol with nothing but pika.

It knows no Switchyard header: it reads its environment (``WORKER_ID``, ``WORKER_KEY``,
``WORKER_POOL``, ``WORKER_REQUESTS_QUEUE``, ``WORKER_ACTIVITY_EXCHANGE``), publishes a ``started``
report, then for each request a ``request-received`` report (routing key = its key, ``x-event``),
answers ``reply-to`` with the correlation id and ``x-status: ok``, and acks.
Run: ``AMQP_URL=... WORKER_...=... python tests/rpc/plain_worker.py``.
"""

import contextlib
import os

import pika

key = os.environ["WORKER_KEY"]
exchange = os.environ["WORKER_ACTIVITY_EXCHANGE"]
connection = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"]))
channel = connection.channel()


def report(event: str) -> None:
    channel.basic_publish(exchange, key, b"", pika.BasicProperties(headers={"x-event": event}))


def on_request(ch, method, props, body) -> None:
    report("request-received")
    if props.reply_to:
        ch.basic_publish("", props.reply_to, f"{os.environ['WORKER_ID']}|{key}|".encode() + body,
                         pika.BasicProperties(correlation_id=props.correlation_id,
                                              headers={"x-status": "ok"}))
    ch.basic_ack(method.delivery_tag)


report("started")
channel.basic_qos(prefetch_count=1)
channel.basic_consume(os.environ["WORKER_REQUESTS_QUEUE"], on_request)
with contextlib.suppress(KeyboardInterrupt):
    channel.start_consuming()
