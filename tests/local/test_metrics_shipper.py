"""The local runtime's metrics reach CloudWatch on LocalStack, as the deployed functions' EMF would.

Against the real LocalStack (``./dev`` starts it on 127.0.0.1:4566; ``SWITCHYARD_LOCALSTACK_URL``
points elsewhere); without it they fail and say how to start it. Each test uses its own namespace
or ``service`` dimension, so runs never mix.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent
from botocore.config import Config

from switchyard.core import observability
from switchyard.local.metrics_shipper import (
    MAX_DATUMS_PER_CALL,
    MetricsShipper,
    ShipperSettings,
    install_metrics_shipper,
    uninstall_metrics_shipper,
)
from switchyard.local.rmq_bridge import rmq_message
from switchyard.rpc import protocol
from tests.conftest import ROOT, require_localstack, subprocess_env, unique, wait_for
from tests.rpc.conftest import make_pool  # noqa: F401 - fixture
from tests.rpc.test_handlers_malformed import dead, event_of

CLOSED_PORT_URL = "http://127.0.0.1:9"  # discard: nothing listens here
# LocalStack stores ~60 datums/s, slower under load (17 s for one 1,000-datum call was seen): flushes
# in tests wait this long rather than the runtime's shutdown default.
FLUSH_S = 120.0


@pytest.fixture(scope="module")
def localstack() -> str:
    return require_localstack()


def client_for(url: str) -> Any:
    return boto3.client("cloudwatch", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
                        aws_secret_access_key="test",
                        config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": 1}))


@pytest.fixture
def cloudwatch(localstack: str) -> Any:
    return client_for(localstack)


@pytest.fixture
def shipper(cloudwatch: Any) -> Iterator[MetricsShipper]:
    s = MetricsShipper(cloudwatch, ShipperSettings(flush_interval_s=60))
    yield s
    s.close()


@pytest.fixture
def installed() -> Iterator[None]:
    """Whatever a test installs is uninstalled: later tests read stdout EMF."""
    yield
    uninstall_metrics_shipper()


def blob(namespace: str, values: dict[str, Any], dims: dict[str, str], unit: str = "Count",
         timestamp_ms: int | None = None) -> dict[str, Any]:
    """An EMF blob as Powertools prints it."""
    return {
        "_aws": {"Timestamp": timestamp_ms or int(time.time() * 1000), "CloudWatchMetrics": [{
            "Namespace": namespace, "Dimensions": [list(dims)],
            "Metrics": [{"Name": name, "Unit": unit} for name in values]}]},
        **dims, **values,
    }


def statistics(cw: Any, namespace: str, name: str, dims: dict[str, str]) -> dict[str, float]:
    """Sum and sample count over the last ten minutes."""
    now = datetime.now(UTC)
    points = cw.get_metric_statistics(
        Namespace=namespace, MetricName=name, Dimensions=[{"Name": k, "Value": v} for k, v in dims.items()],
        StartTime=now - timedelta(minutes=10), EndTime=now + timedelta(minutes=1), Period=600,
        Statistics=["Sum", "SampleCount", "Maximum"])["Datapoints"]
    return {stat: sum(pt[stat] for pt in points) if stat != "Maximum" else max((pt[stat] for pt in points),
                                                                                   default=0.0)
            for stat in ("Sum", "SampleCount", "Maximum")}


def settled(cw: Any, namespace: str, name: str, dims: dict[str, str], sum_: float,
            timeout: float = 30.0) -> dict[str, float]:
    """``statistics`` once its Sum reaches ``sum_`` (LocalStack may answer before it has aggregated
    a call it accepted, on a loaded machine), or as they are after ``timeout``."""
    stats: list[dict[str, float]] = []

    def reached() -> bool:
        stats.append(statistics(cw, namespace, name, dims))
        return stats[-1]["Sum"] >= sum_

    wait_for(reached, timeout, interval=1.0, required=False)
    return stats[-1]


def test_handler_metrics_reach_cloudwatch_through_switchyard_invoke(
        localstack: str, cloudwatch: Any, make_pool, tmp_path: Path) -> None:  # noqa: F811
    """The real rpc_dead_letters handler, run by ``switchyard invoke`` with shipping on: its counts
    arrive under the deployed functions' service dimension, the one the poison alarm selects."""
    pool, _ = make_pool()
    poison = [rmq_message(dead(f"k{n}", "delivery_limit", f"d{n}", None)) for n in range(2)]
    expired = [rmq_message(dead("k9", "expired", "e1", None))]
    event_file = tmp_path / "poison.json"
    event_file.write_text(json.dumps(event_of(protocol.dl_queue(pool), [*poison, *expired])))
    env = subprocess_env(SWITCHYARD_SHIP_METRICS="1", SWITCHYARD_RPC_POOL=pool,
                         AWS_ENDPOINT_URL_CLOUDWATCH=localstack, AWS_ACCESS_KEY_ID="test",
                         AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    for name in ("POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_DISABLED", "AWS_LAMBDA_FUNCTION_NAME"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "switchyard", "invoke", "rpc_dead_letters", "--event",
                           str(event_file)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["poisoned"] == 2  # stdout carries the result only, no EMF
    assert "metrics shipped to CloudWatch: 1 blobs" in done.stderr
    dims = {"service": observability.pool_service(pool)}
    poisoned = wait_for(lambda: statistics(cloudwatch, "Switchyard", "DeadLetterPoisoned", dims)["Sum"],
                        timeout=10, what="DeadLetterPoisoned in CloudWatch")
    assert poisoned == 2
    assert statistics(cloudwatch, "Switchyard", "DeadLetterExpired", dims)["Sum"] == 1


def test_provider_ships_every_flush_and_prints_nothing(
        cloudwatch: Any, installed: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Handlers built by lambda_handler_for (loaded before or after installing), Powertools' own
    100-value flush and emit_gauge all go through the shipper; stdout stays clean."""

    @dataclass
    class Outcome:
        handled: int

    handler = observability.lambda_handler_for(lambda _e, _c: Outcome(handled=3), data_class=EventBridgeEvent,
                                               metric_prefix="Probe")
    service = unique("svc")
    shipper = install_metrics_shipper(service, client=cloudwatch,
                                      settings=ShipperSettings(flush_interval_s=60))
    from switchyard.local.lambda_context import FakeLambdaContext

    for _ in range(4):
        handler({"detail": {}}, FakeLambdaContext("probe", 1000))
    for n in range(250):  # Powertools would print at 100 values of one metric
        observability.metrics.add_metric(name="ProbeLatency", unit="Milliseconds", value=n)
    observability.metrics.flush_metrics()
    observability.emit_gauge("ProbeDepth", 7, "WorkerGroup", "g1")
    assert shipper.flush(FLUSH_S)
    assert capsys.readouterr().out == ""
    dims = {"service": service}
    assert settled(cloudwatch, "Switchyard", "ProbeHandled", dims, 12) == {"Sum": 12, "SampleCount": 4,
                                                                           "Maximum": 3}
    latency = settled(cloudwatch, "Switchyard", "ProbeLatency", dims, sum(range(250)))
    assert (latency["Sum"], latency["SampleCount"], latency["Maximum"]) == (sum(range(250)), 250, 249)
    assert statistics(cloudwatch, "Switchyard", "ProbeDepth", {"WorkerGroup": "g1", **dims})["Sum"] == 7
    assert shipper.stats.malformed == shipper.stats.dropped == shipper.stats.errors == 0


def test_blobs_are_batched_into_few_calls(cloudwatch: Any, shipper: MetricsShipper) -> None:
    namespace = unique("Batch")
    distinct, repeated = 1100, 400
    for n in range(distinct):  # 1,100 dimension values: 1,100 datums, at most 1,000 a call
        shipper.submit(blob(namespace, {"Calls": 1}, {"Node": f"n{n}"}))
    now_ms = int(time.time() * 1000)
    for n in range(repeated):  # one metric, one second: merged into one Values/Counts datum
        shipper.submit(blob(namespace, {"Lateness": n % 7}, {"Node": "hot"}, unit="Milliseconds",
                            timestamp_ms=now_ms))
    assert shipper.flush(FLUSH_S)
    assert shipper.stats.blobs == distinct + repeated
    # A full batch wakes the sender while blobs still arrive: one call more than the minimum at most,
    # and the hot metric possibly cut in two.
    assert shipper.stats.calls <= math.ceil((distinct + 1) / MAX_DATUMS_PER_CALL) + 1
    assert distinct + 1 <= shipper.stats.datums_shipped <= distinct + 2
    assert statistics(cloudwatch, namespace, "Calls", {"Node": "n1034"})["Sum"] == 1
    hot = settled(cloudwatch, namespace, "Lateness", {"Node": "hot"}, sum(n % 7 for n in range(repeated)))
    expected = (sum(n % 7 for n in range(repeated)), repeated, 6)
    assert (hot["Sum"], hot["SampleCount"], hot["Maximum"]) == expected


def test_malformed_blobs_are_counted_drops(cloudwatch: Any, shipper: MetricsShipper) -> None:
    namespace = unique("Bad")
    good = blob(namespace, {"Fine": 5}, {"service": "s"})
    bad: list[Any] = [
        "not a dict", {}, {"_aws": {}}, {**good, "_aws": {**good["_aws"], "CloudWatchMetrics": []}},
        {**good, "Fine": "five"}, {**good, "Fine": float("nan")}, {**good, "Fine": [1, None]},
        {k: v for k, v in good.items() if k != "service"},  # a dimension without its value
        {k: v for k, v in good.items() if k != "Fine"},  # a metric without its value
        {**good, "_aws": {**good["_aws"], "Timestamp": "yesterday"}},
    ]
    for b in bad:
        shipper.submit(b)
    shipper.submit(good)
    assert shipper.flush(FLUSH_S)
    assert shipper.stats.malformed == len(bad)
    assert shipper.stats.blobs == 1 and shipper.stats.datums_shipped == 1
    assert statistics(cloudwatch, namespace, "Fine", {"service": "s"})["Sum"] == 5


def test_unreachable_cloudwatch_drops_oldest_and_never_fails_the_handler(installed: None) -> None:
    @dataclass
    class Outcome:
        handled: int

    handler = observability.lambda_handler_for(lambda _e, _c: Outcome(handled=1), data_class=EventBridgeEvent)
    shipper = install_metrics_shipper(unique("svc"), client=client_for(CLOSED_PORT_URL),
                                      settings=ShipperSettings(flush_interval_s=0.05, max_backlog=50))
    from switchyard.local.lambda_context import FakeLambdaContext

    started = time.monotonic()
    for _ in range(120):
        assert handler({"detail": {}}, FakeLambdaContext("probe", 1000)) == {"handled": 1}
    assert time.monotonic() - started < 5  # the handler never waits for CloudWatch
    wait_for(lambda: shipper.stats.errors >= 2, timeout=10, what="failed PutMetricData calls")
    assert not shipper.flush(timeout_s=5)
    stats = shipper.stats
    assert stats.blobs == 120 and stats.calls == 0 and stats.datums_shipped == 0
    # The backlog stays bounded and the excess is counted. How many datums the 120 blobs make
    # depends on how many fall in one second and one send turn (they merge), so the count of drops
    # is a range: 70 when each blob stays its own datum (a quiet machine), fewer under load.
    assert len(shipper._backlog) <= 50
    assert 0 < stats.dropped <= 120 - 50


@pytest.mark.slow
def test_alarm_on_shipped_metric_goes_to_alarm_then_back_to_ok(
        cloudwatch: Any, shipper: MetricsShipper) -> None:
    """LocalStack evaluates alarms: breaching datapoints shipped -> ALARM; none for a while -> OK."""
    namespace, alarm = unique("Alarm"), unique("poison-growing")
    dims = {"service": "switchyard-alarmtest"}
    cloudwatch.put_metric_alarm(
        AlarmName=alarm, Namespace=namespace, MetricName="DeadLetterPoisoned", Statistic="Sum", Period=10,
        EvaluationPeriods=1, Threshold=1, ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="notBreaching", Dimensions=[{"Name": k, "Value": v} for k, v in dims.items()])
    try:
        def state() -> str:
            return cloudwatch.describe_alarms(AlarmNames=[alarm])["MetricAlarms"][0]["StateValue"]

        started = time.monotonic()

        def breached() -> bool:
            shipper.submit(blob(namespace, {"DeadLetterPoisoned": 1}, dims))
            shipper.flush()
            return state() == "ALARM"

        wait_for(breached, timeout=120, interval=2, what="the alarm to go to ALARM")
        to_alarm = time.monotonic() - started
        calm = time.monotonic()
        wait_for(lambda: state() == "OK", timeout=120, interval=2, what="the alarm to go back to OK")
        back = time.monotonic() - calm
        print(f"alarm: ALARM after {to_alarm:.0f} s of breaching data, OK {back:.0f} s after it")
    finally:
        cloudwatch.delete_alarms(AlarmNames=[alarm])
