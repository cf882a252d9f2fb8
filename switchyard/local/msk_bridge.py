"""An MSK event source mapping, locally: consume a topic in a group, hand batches to a Lambda handler.

As the AWS mapping does: a batch closes at ``batch_size`` records or ``batching_window_ms`` after its
first record; the handler gets the exact ``aws:kafka`` event JSON (base64 key/value, header values
as arrays of Java's signed bytes, so 0x80-0xFF arrive as -128..-1, a null header value as null,
key/value left out when null); offsets are committed only after the handler returns; if it raises,
the same batch is delivered again after a back-off. With ``report_batch_item_failures`` (the
mapping's ``ReportBatchItemFailures``), a response naming failed records commits each such partition
up to its lowest failed offset and delivers it again from there; a malformed response fails the
whole batch, as on AWS.
"""

from __future__ import annotations

import threading
import time
from array import array
from binascii import b2a_base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from switchyard.core.observability import logger
from switchyard.local.lambda_context import FakeLambdaContext

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
    # A fetched record's headers are a list of (name, bytes or None); the stub also allows a dict.
    headers = cast("list[tuple[str, bytes | None]]", msg.headers() or [])
    record["headers"] = [{name: None if v is None else array("b", v).tolist()}  # Java's signed bytes
                         for name, v in headers]
    return record


def _position(msg: Message) -> tuple[tuple[str, int], int]:
    """((topic, partition), offset) of a fetched record: confluent-kafka types each Optional (unset
    only on an error event, which never reaches a batch)."""
    return (cast(str, msg.topic()), cast(int, msg.partition())), cast(int, msg.offset())


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
    report_batch_item_failures: bool = True  # FunctionResponseTypes: ["ReportBatchItemFailures"]
    # The broker answers a fetch at this many bytes or after 100 ms (see below); 1: at the first
    # record, for a mapping whose records are each waited for (the scheduled-call relay).
    fetch_min_bytes: int = 65536
    fetch_wait_max_ms: int = 100  # how long the broker holds a fetch with less than fetch_min_bytes
    cluster_arn: str = "arn:aws:kafka:local:000000000000:cluster/local/00000000-0000-0000-0000-000000000000-1"


class MskBridge:
    """Runs ``handler`` on batches of ``config.topic`` until ``stop`` is set."""

    def __init__(self, config: MskBridgeConfig, handler: Handler) -> None:
        self.config = config
        self.handler = handler
        self.invocations = 0
        self.failures = 0  # whole batches failed (the handler raised or answered a malformed response)
        self.partial_failures = 0  # invocations that named failed records
        self._consumer = Consumer({
            "bootstrap.servers": config.bootstrap,
            "group.id": config.group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest" if config.starting_position == "TRIM_HORIZON" else "latest",
            "session.timeout.ms": config.session_timeout_ms,
            "heartbeat.interval.ms": max(100, config.session_timeout_ms // 4),
            # A fetch returns at 64 KiB or after 100 ms, not at the first byte: at 10,000 records/s
            # that is a fetch per ~600 records instead of one per handful (broker CPU), and an idle
            # topic costs 10 empty fetches a second, not 100 (the 10 ms it was: 3.7% of a core idle).
            # The batching window waits as long anyway.
            "fetch.wait.max.ms": config.fetch_wait_max_ms,
            "fetch.min.bytes": config.fetch_min_bytes,
            "client.id": f"msk-bridge-{config.function_name}",
        })

    def _collect(self, stop: threading.Event) -> list[Message]:
        batch: list[Message] = []
        window_end: float | None = None
        while not stop.is_set() and len(batch) < self.config.batch_size:
            if window_end is None:  # the first record: poll returns with it (consume would wait 0.1 s
                first = self._consumer.poll(0.1)  # for a full batch), so the window starts at it
                fetched = [first] if first is not None else []
            else:
                fetched = self._consumer.consume(self.config.batch_size - len(batch),
                                                 max(0.0, window_end - time.monotonic()))
            for msg in fetched:
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

    @staticmethod
    def _bounds(batch: list[Message]) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """First and last offset of each partition in the batch."""
        first: dict[tuple[str, int], int] = {}
        last: dict[tuple[str, int], int] = {}
        for msg in batch:
            tp, offset = _position(msg)
            first[tp] = min(first.get(tp, offset), offset)
            last[tp] = max(last.get(tp, offset), offset)
        return first, last

    def _settle(self, batch: list[Message], retry_from: dict[tuple[str, int], int]) -> int:
        """Commit every partition up to its retry point (or its end), rewind those to be retried.

        Returns how many records were committed.
        """
        first, last = self._bounds(batch)
        ends = {tp: retry_from.get(tp, last[tp] + 1) for tp in last}
        offsets = [TopicPartition(t, p, end) for (t, p), end in ends.items() if end > first[(t, p)]]
        if offsets:
            try:
                self._consumer.commit(offsets=offsets, asynchronous=False)
            except Exception as exc:
                logger.warning("offset commit failed; the batch may come again", extra={"error": str(exc)})
        for (topic, partition), offset in retry_from.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except Exception as exc:
                logger.warning("cannot rewind for a redelivery", extra={"error": str(exc)})
        return sum(1 for m in batch if _position(m)[1] < ends[_position(m)[0]])

    def _retry_points(self, batch: list[Message], response: Any) -> dict[tuple[str, int], int] | None:
        """Per partition, the lowest offset a partial batch response names; None if it is malformed.

        As the AWS mapping: no response, no ``batchItemFailures`` or an empty list is a success; an
        identifier that is not ``{"partition": "<topic>-<n>", "offset": <int>}`` of a record of this
        batch fails the whole batch.
        """
        failures = response.get("batchItemFailures") if isinstance(response, dict) else None
        if not failures or not self.config.report_batch_item_failures:
            return {}
        in_batch = {(f"{topic}-{partition}", offset): (topic, partition)
                    for (topic, partition), offset in map(_position, batch)}
        retry: dict[tuple[str, int], int] = {}
        for failure in failures:
            ident = failure.get("itemIdentifier") if isinstance(failure, dict) else None
            if not isinstance(ident, dict) or (ident.get("partition"), ident.get("offset")) not in in_batch:
                logger.error("malformed partial batch response; the whole batch fails",
                             extra={"function_name": self.config.function_name, "item": repr(failure)[:200]})
                return None
            tp = in_batch[(ident["partition"], ident["offset"])]
            retry[tp] = min(retry.get(tp, ident["offset"]), ident["offset"])
        return retry

    def run_once(self, stop: threading.Event) -> int:
        """Collect one batch, invoke the handler, commit what it settled and rewind the rest.

        Returns the number of records settled (committed) by this invocation.
        """
        batch = self._collect(stop)
        if not batch:
            return 0
        event = build_msk_event(batch, self.config.bootstrap, self.config.cluster_arn)
        context = FakeLambdaContext(self.config.function_name, self.config.invocation_timeout_ms)
        self.invocations += 1
        try:
            retry_from = self._retry_points(batch, self.handler(event, context))
        except Exception:
            logger.exception("handler failed; the batch will be delivered again",
                             extra={"function_name": self.config.function_name, "records": len(batch)})
            retry_from = None
        if retry_from is None:
            self.failures += 1
            retry_from = self._bounds(batch)[0]  # every partition again from its first record
        elif retry_from:
            self.partial_failures += 1
        settled = self._settle(batch, retry_from)
        if retry_from:
            stop.wait(self.config.retry_backoff_ms / 1000)
        return settled

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set, then leave the group."""
        self._consumer.subscribe([self.config.topic])
        try:
            while not stop.is_set():
                self.run_once(stop)
        finally:
            self._consumer.close()
