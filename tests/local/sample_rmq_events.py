"""The sample ``aws:rmq`` events in ``events/``, built with ``build_rmq_event``.

Regenerate with ``.venv/bin/python -m tests.local.sample_rmq_events``; a test checks the files
still equal what this module builds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pika

from switchyard.local.rmq_bridge import RmqDelivery, build_rmq_event
from switchyard.rpc import protocol

EVENTS_DIR = Path(__file__).resolve().parents[2] / "events"
BROKER_ARN = "arn:aws:mq:us-east-1:123456789012:broker:switchyard:b-00000000-aaaa-bbbb-cccc-000000000000"
POOL = "demo"
KEY = "infra=42"
REPLY_TO = "amq.rabbitmq.reply-to.g1h2AA5yZXBseUAxNjYwMTIzNDU2AAAAAQAAAAFlvAmH"
SENT = 1764590941  # 2025-12-01 12:09:01 UTC


def orphan_event() -> dict[str, Any]:
    """A request no request queue was bound for: routed to ``demo-orphan`` by the alternate exchange.

    The event carries no routing key, so the key travels in ``x-switchyard-key``.
    """
    props = pika.BasicProperties(
        delivery_mode=2, correlation_id="9f3c1a2b.3.1", reply_to=REPLY_TO, expiration="30000",
        headers={protocol.KEY_HEADER: KEY},
    )
    return build_rmq_event(protocol.orphan_queue(POOL), "/", [RmqDelivery(b'{"train":"TGV 6611"}', props)],
                           broker_arn=BROKER_ARN)


def dead_letter_event() -> dict[str, Any]:
    """A request whose TTL ran out in its request queue, dead-lettered to ``demo-dl``."""
    died = datetime.fromtimestamp(SENT + 30, UTC)
    props = pika.BasicProperties(
        delivery_mode=2, correlation_id="9f3c1a2b.5.2", reply_to=REPLY_TO,
        headers={
            protocol.KEY_HEADER: KEY,
            protocol.FIRST_DEATH_REASON_HEADER: "expired",
            "x-first-death-queue": protocol.request_queue(POOL, KEY),
            "x-first-death-exchange": protocol.req_exchange(POOL),
            "x-last-death-reason": "expired",
            "x-last-death-queue": protocol.request_queue(POOL, KEY),
            "x-last-death-exchange": protocol.req_exchange(POOL),
            protocol.DEATH_HEADER: [{
                "count": 1,
                "reason": "expired",
                "queue": protocol.request_queue(POOL, KEY),
                "time": died,
                "exchange": protocol.req_exchange(POOL),
                "routing-keys": [KEY],
                "original-expiration": "30000",
            }],
        },
    )
    return build_rmq_event(protocol.dl_queue(POOL), "/", [RmqDelivery(b'{"train":"TGV 6611"}', props)],
                           broker_arn=BROKER_ARN)


def activity_event() -> dict[str, Any]:
    """A worker's ``request-received`` report, as published to ``demo-activity-xchg`` (key in a header)."""
    props = pika.BasicProperties(
        timestamp=SENT,
        headers={protocol.EVENT_HEADER: protocol.Event.REQUEST_RECEIVED.value,
                 protocol.WORKER_ID_HEADER: "demo-4a1f-7c2e9d10", protocol.KEY_HEADER: KEY},
    )
    return build_rmq_event(protocol.activity_queue(POOL), "/", [RmqDelivery(b"", props)],
                           broker_arn=BROKER_ARN)


SAMPLES = {
    "rmq_orphan.json": orphan_event,
    "rmq_dead_letter.json": dead_letter_event,
    "rmq_activity.json": activity_event,
}


def render(event: dict[str, Any]) -> str:
    return json.dumps(event, indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    for name, build in SAMPLES.items():
        (EVENTS_DIR / name).write_text(render(build()), encoding="utf-8")
        print(EVENTS_DIR / name)


if __name__ == "__main__":
    main()
