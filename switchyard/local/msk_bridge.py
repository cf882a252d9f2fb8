"""An MSK event source mapping, locally: consume a topic in a group, hand batches to a Lambda handler.

As the AWS mapping does: a batch closes at ``batch_size`` records or ``batching_window_ms`` after its
first record; the handler gets the exact ``aws:kafka`` event JSON (base64 key/value, header values
as byte arrays, key/value left out when null); offsets are committed only after the handler
returns; if it raises, the same batch is delivered again after a back-off.
"""

from __future__ import annotations

import threading
import time
from binascii import b2a_base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.observability import logger

Handler = Callable[[dict[str, Any], Any], Any]

_TIMESTAMP_TYPES = {0: "NO_TIMESTAMP_TYPE", 1: "CREATE_TIME", 2: "LOG_APPEND_TIME"}


def _b64(data: bytes) -> str:
    return b2a_base64(data, newline=False).decode("ascii")  # base64.b64encode without its checks


def msk_record(msg: Message) -> dict[str, Any]:
    """One consumed message as an ``aws:kafka`` event record."""
    ts_type, ts = msg.timestamp()
    record: dict[str, Any] = {
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp": ts,
        "timestampType": _TIMESTAMP_TYPES.get(ts_type, "CREATE_TIME"),
    }
    key, value = msg.key(), msg.value()
    if key is not None:
        record["key"] = _b64(key)
    if value is not None:
        record["value"] = _b64(value)
    headers = msg.headers()
    record["headers"] = [{name: list(v) if v else []} for name, v in headers] if headers else []
    return record


def build_msk_event(messages: Iterable[Message], bootstrap: str, cluster_arn: str) -> dict[str, Any]:
    """The event Lambda receives from an MSK mapping: records grouped by ``<topic>-<partition>``."""
    records: dict[str, list[dict[str, Any]]] = {}
    for msg in messages:
        records.setdefault(f"{msg.topic()}-{msg.partition()}", []).append(msk_record(msg))
    return {"eventSource": "aws:kafka", "eventSourceArn": cluster_arn, "bootstrapServers": bootstrap,
            "records": records}


@dataclass(frozen=True)
class MskBridgeConfig:
    """The mapping's settings (names as in the AWS API, where there is one)."""

    bootstrap: str
    topic: str
    group_id: str
    function_name: str
    batch_size: int = 100
    batching_window_ms: int = 500
    starting_position: str = "TRIM_HORIZON"  # or LATEST
    session_timeout_ms: int = 6000
    retry_backoff_ms: int = 500
    invocation_timeout_ms: int = 60_000
    cluster_arn: str = "arn:aws:kafka:local:000000000000:cluster/local/00000000-0000-0000-0000-000000000000-1"


class MskBridge:
    """Runs ``handler`` on batches of ``config.topic`` until ``stop`` is set."""

    def __init__(self, config: MskBridgeConfig, handler: Handler) -> None:
        self.config = config
        self.handler = handler
        self.invocations = 0
        self.failures = 0
        self._consumer = Consumer({
            "bootstrap.servers": config.bootstrap,
            "group.id": config.group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest" if config.starting_position == "TRIM_HORIZON" else "latest",
            "session.timeout.ms": config.session_timeout_ms,
            "heartbeat.interval.ms": max(100, config.session_timeout_ms // 4),
            "fetch.wait.max.ms": 10,
            # A fetch returns at 64 KiB or after 10 ms, not at the first byte: at 10,000 records/s
            # that is ~100 fetches a second instead of one per handful of records (broker CPU).
            "fetch.min.bytes": 65536,
            "client.id": f"msk-bridge-{config.function_name}",
        })

    def _collect(self, stop: threading.Event) -> list[Message]:
        batch: list[Message] = []
        window_end: float | None = None
        while not stop.is_set() and len(batch) < self.config.batch_size:
            timeout = 0.1 if window_end is None else max(0.0, window_end - time.monotonic())
            for msg in self._consumer.consume(self.config.batch_size - len(batch), timeout):
                err = msg.error()
                if err is None:
                    batch.append(msg)
                elif err.code() != KafkaError._PARTITION_EOF:
                    logger.warning("input consumer error", extra={"error": str(err)})
            if batch and window_end is None:
                window_end = time.monotonic() + self.config.batching_window_ms / 1000
            if window_end is not None and time.monotonic() >= window_end:
                break
        return batch

    def _rewind(self, batch: list[Message]) -> None:
        first: dict[tuple[str, int], int] = {}
        for msg in batch:
            tp = (msg.topic(), msg.partition())
            first[tp] = min(first.get(tp, msg.offset()), msg.offset())
        for (topic, partition), offset in first.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except Exception as exc:
                logger.warning("cannot rewind after a failed batch", extra={"error": str(exc)})

    def _commit(self, batch: list[Message]) -> None:
        last: dict[tuple[str, int], int] = {}
        for msg in batch:
            tp = (msg.topic(), msg.partition())
            last[tp] = max(last.get(tp, -1), msg.offset())
        offsets = [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:
            logger.warning("offset commit failed; the batch may come again", extra={"error": str(exc)})

    def run_once(self, stop: threading.Event) -> int:
        """Collect one batch, invoke the handler, commit (or rewind on failure). Returns the batch size."""
        batch = self._collect(stop)
        if not batch:
            return 0
        event = build_msk_event(batch, self.config.bootstrap, self.config.cluster_arn)
        context = FakeLambdaContext(self.config.function_name, self.config.invocation_timeout_ms)
        self.invocations += 1
        try:
            self.handler(event, context)
        except Exception:
            self.failures += 1
            logger.exception("handler failed; the batch will be delivered again",
                             extra={"function_name": self.config.function_name, "records": len(batch)})
            self._rewind(batch)
            stop.wait(self.config.retry_backoff_ms / 1000)
            return 0
        self._commit(batch)
        return len(batch)

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set, then leave the group."""
        self._consumer.subscribe([self.config.topic])
        try:
            while not stop.is_set():
                self.run_once(stop)
        finally:
            self._consumer.close()
