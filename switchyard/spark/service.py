"""Composition: a partition's publisher, wired from the job's settings.

``PartitionPublisher`` is built once on the driver and shipped to every task with its closure; in
the task it makes the adapters behind ``ports``: a slotted ``RpcClient`` per pool (publisher
confirms on, the job's concurrency and timeout) and an idempotent Kafka producer to the delay
scheduler's input topic, each only when the partition has a row for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Producer

from switchyard.core.msk_auth import kafka_security_config
from switchyard.rpc.client import RpcClient
from switchyard.spark.calls import CallOptions, call_partition
from switchyard.spark.ports import ConnectPool, ConnectProducer, DelayProducer, PoolCaller
from switchyard.spark.rows import Request
from switchyard.spark.schedule import schedule_partition
from switchyard.spark.settings import SparkSettings

CLIENT_NAME = "switchyard-spark"  # the broker connection's and the Kafka client's name


def pool_callers(settings: SparkSettings, options: CallOptions) -> ConnectPool:
    """One ``RpcClient`` per pool, with confirms (a row is ``sent`` only once the broker has it)."""

    def connect(pool: str) -> PoolCaller:
        return RpcClient(pool, settings.rpc, concurrency=options.concurrency, timeout=options.timeout_s,
                         confirm=True, name=CLIENT_NAME)

    return connect


def delay_producer(settings: SparkSettings, timeout_s: float) -> ConnectProducer:
    """An idempotent producer (``acks=all``) whose messages time out with the job's ``--timeout``."""

    def connect() -> DelayProducer:
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 5, "message.timeout.ms": int(timeout_s * 1000),
                             "client.id": CLIENT_NAME, **kafka_security_config()})
        # confluent-kafka's stub wants headers as a list of (str, str | bytes | None) (invariant); the
        # publisher passes a list of (str, bytes) (chronos_headers), which it takes at run time.
        return cast(DelayProducer, producer)

    return connect


@dataclass(frozen=True)
class PartitionPublisher:
    """What a Spark task runs on its partition: the rows to call now, or the rows to schedule."""

    settings: SparkSettings
    options: CallOptions

    def call(self, requests: Iterable[Request], on_result: Callable[[tuple], None] | None = None,
             before_send: Callable[[Request], None] | None = None) -> Iterator[tuple]:
        """Call each request on its pool; one results row each (``calls.call_partition``)."""
        return call_partition(requests, self.options, pool_callers(self.settings, self.options),
                              on_result, before_send)

    def schedule(self, requests: Iterable[Request],
                 on_result: Callable[[tuple], None] | None = None) -> Iterator[tuple]:
        """Produce each request to the delay input topic; one results row each (``schedule``)."""
        return schedule_partition(requests, delay_producer(self.settings, self.options.timeout_s),
                                  self.settings.delay_topic, self.options.timeout_s, on_result,
                                  self.options.reply_queue)
