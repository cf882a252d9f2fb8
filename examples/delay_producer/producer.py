"""A Python producer for Switchyard's delay scheduler, without Switchyard: a Kafka producer and two
headers (docs/delay.md). The scheduler stores the message and publishes the same key, value and other
headers on its output topic at the deadline.

    python producer.py --in 5s --key order-17 --value '{"remind": true}'
    python producer.py --in 1m --key infra=42 --value report --pool core   # a scheduled call (docs/rpc.md)

It reads SWITCHYARD_KAFKA_BOOTSTRAP and SWITCHYARD_DELAY_INPUT_TOPIC as Switchyard does, and prints the
message id (re-producing a waiting id is a no-op: use your own id to make a retry safe).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import uuid
from datetime import UTC, datetime, timedelta

from confluent_kafka import Producer

MESSAGE_ID_HEADER = "chronosMessageId"  # 1-128 characters, no NUL; unique among waiting messages
DEADLINE_HEADER = "chronosDeadline"  # ISO 8601 with seconds; without an offset the time is UTC


def deadline_header(deadline: datetime) -> bytes:
    """The deadline as the scheduler reads it: UTC, milliseconds, ``Z``."""
    return deadline.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z").encode()


def call_headers(pool: str, key: str, call_id: str,
                 reply_queue: str | None = None) -> list[tuple[str, bytes]]:
    """The headers that make the record a scheduled call of ``key`` in ``pool`` (docs/rpc.md, the
    scheduled call's record). ``reply_queue``: the full name, ``switchyard-reply-{name}``, declared by
    you beforehand (classic, durable); None: no answer."""
    headers = [("x-switchyard-pool", pool.encode()), ("x-switchyard-key", key.encode()),
               ("x-switchyard-id", call_id.encode())]
    if reply_queue is not None:
        headers.append(("x-switchyard-reply-queue", reply_queue.encode()))
    return headers


def schedule(producer: Producer, topic: str, key: str, value: bytes, deadline: datetime, *,
             message_id: str | None = None, headers: list[tuple[str, bytes]] | None = None,
             timeout: float = 30.0) -> str:
    """Produce one delayed message and wait until Kafka has it; returns its id."""
    message_id = message_id or uuid.uuid4().hex
    reports: list[object] = []
    producer.produce(topic, key=key.encode(), value=value,
                     headers=[(MESSAGE_ID_HEADER, message_id.encode()),
                              (DEADLINE_HEADER, deadline_header(deadline)), *(headers or [])],
                     on_delivery=lambda err, _msg: reports.append(err))
    if producer.flush(timeout) or reports != [None]:
        raise RuntimeError(f"Kafka did not take message {message_id}: {reports or 'no report in time'}")
    return message_id


def parse_in(text: str) -> timedelta:
    """``500ms``, ``5s``, ``2m``, ``1h``: how far ahead the deadline is."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r}: use a number and ms, s, m or h (5s, 500ms)")
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    return timedelta(seconds=float(match.group(1)) * unit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in", dest="delay", type=parse_in, default=timedelta(seconds=5),
                        help="how far ahead the deadline is (500ms, 5s, 2m, 1h; default 5s)")
    parser.add_argument("--key", required=True, help="the record's key (a scheduled call's key with --pool)")
    parser.add_argument("--value", default="", help="the record's value (the request body with --pool)")
    parser.add_argument("--id", help="the message id (default: a new UUID)")
    parser.add_argument("--pool", help="make it a scheduled call of --key in this pool (no answer kept)")
    parser.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                        help="another header, relayed to the output topic (repeatable)")
    args = parser.parse_args(argv)
    extra = [tuple(h.split("=", 1)) for h in args.header]
    if any(len(h) != 2 for h in extra):
        parser.error("--header takes NAME=VALUE")
    message_id = args.id or uuid.uuid4().hex
    headers = [(name, value.encode()) for name, value in extra]
    if args.pool:
        headers = call_headers(args.pool, args.key, message_id) + headers
    producer = Producer({"bootstrap.servers": os.environ.get("SWITCHYARD_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
                         "enable.idempotence": True, "acks": "all"})
    topic = os.environ.get("SWITCHYARD_DELAY_INPUT_TOPIC", "switchyard-delay-input")
    deadline = datetime.now(UTC) + args.delay
    try:
        print(schedule(producer, topic, args.key, args.value.encode(), deadline, message_id=message_id,
                       headers=headers))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
