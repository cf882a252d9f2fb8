"""The strangers' shapes themselves: RabbitMQ takes every one, pika's own decoder does not, and the
scenario's skimmer reads them all back (so a poisoned stranger is always found)."""

from __future__ import annotations

import random

import pika
import pytest

from switchyard.core.config import Connections
from tests.conftest import unique
from tests.faults import strangers
from tests.faults.malformed import SEED


def test_the_broker_takes_every_shape_and_the_skimmer_reads_them_back() -> None:
    url = Connections.from_env().amqp_url
    sent = strangers.amqp_strangers(random.Random(SEED), 48)
    queue = unique("strangers")
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, auto_delete=False)
        for stranger in sent:
            stranger.headers.append((b"x-switchyard-poison-reason",
                                     strangers.long_string(stranger.shape.encode())))
            channel.basic_publish("", queue, stranger.id.encode(), stranger.properties("guest"))  # confirmed
        back = strangers.read_queue(url, queue)
        channel.queue_delete(queue)
    finally:
        connection.close()
    assert [body.decode() for body, _ in back] == [st.id for st in sent]
    assert [headers["x-switchyard-poison-reason"] for _, headers in back] == [st.shape for st in sent]


@pytest.mark.parametrize("shape", sorted(strangers.UNDECODABLE))
def test_pika_cannot_decode_the_undecodable_shapes(shape: str) -> None:
    headers, props = strangers.UNDECODABLE[shape](random.Random(SEED))
    if shape == "odd header value":  # one of many values: the two the issue names
        headers = [(b"sent-at", strangers.timestamp(1_764_640_000_000)),
                   (b"path", strangers.nested_array(1_200))]
    encoded = b"".join(
        strangers.Stranger("x", shape, strangers.WORKER, headers, props).properties("guest").encode())
    with pytest.raises((ValueError, OverflowError, RecursionError)):
        pika.BasicProperties().decode(encoded)
    assert strangers.SkimmedProperties().decode(encoded).message_id == "x"
