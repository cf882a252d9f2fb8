"""The pipeline's part shape: settings read in one module, the summary's count names defined once, a
partition's calls and scheduled rows going through the ports (tested here with fakes, no broker)."""

from __future__ import annotations

import re
from concurrent.futures import Future
from dataclasses import fields
from pathlib import Path

import pytest

from switchyard.core.errors import ConfigError, SwitchyardError
from switchyard.rpc.client import Response
from switchyard.rpc.errors import CallTimeoutError
from switchyard.spark import errors, metrics, rows
from switchyard.spark.calls import CallOptions, call_partition
from switchyard.spark.schedule import schedule_partition
from switchyard.spark.settings import EmrSettings, SparkSettings

SPARK = Path(metrics.__file__).parent


def test_only_settings_reads_the_environment() -> None:
    readers = sorted(path.name for path in SPARK.glob("*.py") if "os.environ" in path.read_text()
                     or re.search(r"\bgetenv\(", path.read_text()))
    assert readers == ["settings.py"]


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_KAFKA_BOOTSTRAP", "kafka.example:9094")
    monkeypatch.setenv("SWITCHYARD_DELAY_INPUT_TOPIC", "rows-in")
    monkeypatch.setenv("SWITCHYARD_EMR_APPLICATION_ID", "app1")
    monkeypatch.delenv("SWITCHYARD_EMR_LOG_URI", raising=False)
    settings = SparkSettings.from_env()
    assert (settings.kafka_bootstrap, settings.delay_topic) == ("kafka.example:9094", "rows-in")
    assert SparkSettings.from_env("given").delay_topic == "given"  # --delay-topic wins
    assert EmrSettings.from_env().application_id == "app1" and EmrSettings.from_env().log_uri is None


def test_errors_are_in_the_tree() -> None:
    assert issubclass(errors.SparkError, SwitchyardError)
    assert issubclass(errors.PublishOptionsError, ConfigError)  # what the job raised before
    for cls in (errors.EmrJobError, errors.StoreError, errors.PackagingError, errors.InvalidJobInputError):
        assert issubclass(cls, errors.SparkError)


def test_summary_count_names_are_defined_once_and_match_the_summary() -> None:
    pytest.importorskip("pyspark")
    from switchyard.spark.job import PublishSummary

    names = {f.name for f in fields(PublishSummary)}
    assert set(metrics.SUMMARY_FIELDS) <= names, set(metrics.SUMMARY_FIELDS) - names
    assert set(metrics.SUMMARY_FIELDS.values()) == metrics.EMITTED
    for name, value in vars(metrics).items():
        if name.isupper() and isinstance(value, str):
            assert name == re.sub(r"(?<!^)(?=[A-Z])", "_", value).upper() and value in metrics.EMITTED
    summary = PublishSummary("run", 7, 2, {"missing_key": 1, "invalid_key": 2}, {}, {}, 1.0)
    assert metrics.summary_counts(summary) == {"SparkRowsSent": 7, "SparkRowsAlreadyFinal": 2,
                                               "SparkRowsBad": 3}


class FakeCaller:
    """A pool that answers ``ok`` at once, except for keys starting with ``slow`` (a timeout)."""

    def __init__(self, pool: str, closed: list[str]) -> None:
        self.pool, self.closed = pool, closed

    def submit(self, key: str, body: bytes, *, timeout: float, headers: object = None) -> Future[Response]:
        future: Future[Response] = Future()
        if key.startswith("slow"):
            future.set_exception(CallTimeoutError("no answer"))
        else:
            future.set_result(Response("ok", body.upper(), "c"))
        return future

    def send(self, key: str, body: bytes, *, timeout: float, headers: object = None) -> Future[None]:
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def close(self) -> None:
        self.closed.append(self.pool)


def test_a_partition_calls_through_the_pool_port() -> None:
    closed: list[str] = []
    requests = [rows.Request("1", "a", "k1", b"x", None), rows.Request("2", "b", "slow", b"y", None)]
    batch_rows = list(call_partition(requests, CallOptions(timeout_s=1, retries=1, concurrency=4),
                                     lambda pool: FakeCaller(pool, closed)))
    by_id = {row[0]: row for row in batch_rows}
    assert (by_id["1"][3], by_id["1"][6]) == ("ok", b"X")
    assert (by_id["2"][3], by_id["2"][4]) == ("timeout", 2)  # retried once, then final
    assert sorted(closed) == ["a", "b"]


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, list]] = []
        self._reports: list = []

    def produce(self, topic, *, key, value, headers, on_delivery) -> None:
        self.sent.append((topic, key, headers))
        self._reports.append(on_delivery)

    def poll(self, timeout: float) -> int:
        reports, self._reports = self._reports, []
        for report in reports:
            report(None, None)
        return len(reports)

    def flush(self, timeout: float) -> int:
        return self.poll(timeout)


def test_a_partition_schedules_through_the_producer_port() -> None:
    made: list[FakeProducer] = []

    def connect() -> FakeProducer:
        made.append(FakeProducer())
        return made[-1]

    assert list(schedule_partition([], connect, "delay-in")) == [] and not made  # no row: no producer
    batch_rows = list(schedule_partition([rows.Request("1", "a", "k", b"v", "2030-01-01T00:00:00Z")], connect,
                                         "delay-in"))
    assert [row[3] for row in batch_rows] == ["scheduled"]
    (topic, key, headers), = made[0].sent
    assert (topic, key) == ("delay-in", b"k") and ("chronosMessageId", b"1") in headers
