"""The local MSK event source: exact aws:kafka events, commit only after the handler returns."""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

import pytest
from aws_lambda_powertools.utilities.data_classes.kafka_event import KafkaEvent

from switchyard.core.config import Connections
from switchyard.delay.msk import records_from_kafka_event
from switchyard.delay.settings import DelaySettings
from switchyard.local.msk_bridge import MskBridge, MskBridgeConfig
from tests.conftest import wait_for
from tests.delay.conftest import committed_offsets, produce


def bridge(settings: DelaySettings, connections: Connections, handler: Any, group: str) -> MskBridge:
    return MskBridge(MskBridgeConfig(bootstrap=connections.kafka_bootstrap, topic=settings.input_topic,
                                     group_id=group, function_name="t", batch_size=10, batching_window_ms=300,
                                     session_timeout_ms=2000, retry_backoff_ms=50), handler)


def run_until(b: MskBridge, done: Any, timeout: float = 15) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=b.run, args=(stop,))
    thread.start()
    try:
        wait_for(done, timeout=timeout, what="bridge invocations")
    finally:
        stop.set()
        thread.join(10)


def test_event_has_the_exact_msk_shape(settings: DelaySettings, connections: Connections) -> None:
    produce(connections.kafka_bootstrap, settings.input_topic, [
        {"key": b"k1", "value": b"\x00v1",
         "headers": [("h", b"\x01\xff\x80\x7f"), ("h", b"2"), ("null", None)]},
        {"key": None, "value": None, "headers": [("only", b"")]},
    ])
    events: list[dict[str, Any]] = []
    run_until(bridge(settings, connections, lambda e, _c: events.append(e), "g-shape"),
              lambda: sum(len(r) for e in events for r in e["records"].values()) >= 2)
    event = events[0] if len(events) == 1 else {**events[0], "records": {
        k: v for e in events for k, v in e["records"].items()}}
    assert json.loads(json.dumps(event)) == event  # plain JSON types only
    assert event["eventSource"] == "aws:kafka" and event["eventSourceArn"].startswith("arn:aws:kafka:")
    assert event["bootstrapServers"] == connections.kafka_bootstrap
    records = [r for key, rs in event["records"].items() for r in rs]
    for key, rs in event["records"].items():
        assert all(key == f"{r['topic']}-{r['partition']}" for r in rs)
    full = next(r for r in records if "key" in r)
    assert set(full) == {"topic", "partition", "offset", "timestamp", "timestampType", "key", "value",
                         "headers"}
    assert (base64.b64decode(full["key"]), base64.b64decode(full["value"])) == (b"k1", b"\x00v1")
    assert full["headers"] == [{"h": [1, -1, -128, 127]}, {"h": [50]}, {"null": None}]  # Java's signed bytes
    assert full["timestampType"] == "CREATE_TIME" and isinstance(full["timestamp"], int)
    empty = next(r for r in records if "key" not in r)
    assert "value" not in empty and empty["headers"] == [{"only": []}]
    parsed = list(records_from_kafka_event(KafkaEvent(event)))  # Powertools reads it
    assert {(r.key, r.value) for r in parsed} == {(b"k1", b"\x00v1"), (None, None)}
    assert next(r for r in parsed if r.key == b"k1").headers == (
        ("h", b"\x01\xff\x80\x7f"), ("h", b"2"), ("null", None))


def test_partial_batch_response_commits_what_precedes_and_redelivers_from_the_first_failure(
    settings: DelaySettings, connections: Connections,
) -> None:
    produce(connections.kafka_bootstrap, settings.input_topic,
            [{"value": str(i).encode(), "partition": 0} for i in range(6)])
    batches: list[list[int]] = []
    seen_committed: list[list[int]] = []
    topic_partition, bootstrap = f"{settings.input_topic}-0", connections.kafka_bootstrap

    def fails_2_and_4_once(event: dict[str, Any], _ctx: Any) -> dict[str, Any]:
        offsets = [r["offset"] for rs in event["records"].values() for r in rs]
        batches.append(offsets)
        seen_committed.append(committed_offsets(bootstrap, "g-partial", settings.input_topic))
        if len(batches) == 1:  # a response in Powertools' Kafka shape, lowest failure not first
            return {"batchItemFailures": [{"itemIdentifier": {"partition": topic_partition, "offset": o}}
                                          for o in (4, 2) if o in offsets]}
        return {"batchItemFailures": []}

    b = bridge(settings, connections, fails_2_and_4_once, "g-partial")
    run_until(b, lambda: len(batches) >= 2 and 5 in batches[-1])
    assert batches[0][:3] == [0, 1, 2]
    assert seen_committed[1][0] == 2  # the first invocation committed offsets 0 and 1 only
    assert batches[1][0] == 2  # and the partition came again from its first failed record
    assert (b.partial_failures, b.failures) == (1, 0)
    assert committed_offsets(connections.kafka_bootstrap, "g-partial", settings.input_topic)[0] == 6


@pytest.mark.parametrize("response", [
    {"batchItemFailures": [{"itemIdentifier": None}]},
    {"batchItemFailures": [{"itemIdentifier": {"topic-partition": "x-0", "offset": 1}}]},  # bad key name
    {"batchItemFailures": [{"itemIdentifier": {"partition": "unknown-0", "offset": 1}}]},  # not in the batch
], ids=["null", "bad_key", "unknown_record"])
def test_malformed_partial_batch_response_fails_the_whole_batch(
    settings: DelaySettings, connections: Connections, response: dict[str, Any],
) -> None:
    produce(connections.kafka_bootstrap, settings.input_topic,
            [{"value": str(i).encode(), "partition": 0} for i in range(3)])
    calls: list[list[int]] = []

    def answers_badly_once(event: dict[str, Any], _ctx: Any) -> dict[str, Any]:
        calls.append([r["offset"] for rs in event["records"].values() for r in rs])
        return response if len(calls) == 1 else {}

    b = bridge(settings, connections, answers_badly_once, "g-malformed")
    run_until(b, lambda: len(calls) >= 2 and 2 in calls[-1])
    assert calls[1][0] == 0 and (b.failures, b.partial_failures) == (1, 0)


def test_failed_batch_is_redelivered_and_committed_only_after_success(
    settings: DelaySettings, connections: Connections,
) -> None:
    produce(connections.kafka_bootstrap, settings.input_topic,
            [{"key": str(i).encode(), "value": b"v", "headers": [("n", str(i).encode())]} for i in range(6)])
    seen: list[list[tuple[int, int]]] = []
    calls = {"n": 0}

    def flaky(event: dict[str, Any], _ctx: Any) -> None:
        calls["n"] += 1
        batch = [(r["partition"], r["offset"]) for rs in event["records"].values() for r in rs]
        if calls["n"] == 1:
            nothing = [-1001, -1001]
            assert committed_offsets(connections.kafka_bootstrap, "g-flaky", settings.input_topic) == nothing
            raise RuntimeError("simulated crash before the commit")
        seen.append(batch)

    b = bridge(settings, connections, flaky, "g-flaky")
    run_until(b, lambda: sum(len(s) for s in seen) >= 6)
    delivered = sorted(x for s in seen for x in s)
    assert len(delivered) == 6 and len(set(delivered)) == 6 and b.failures == 1
    ends = committed_offsets(connections.kafka_bootstrap, "g-flaky", settings.input_topic)
    assert sum(ends) == 6  # next offsets per partition add up to all six records
