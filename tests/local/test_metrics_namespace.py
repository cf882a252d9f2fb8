"""The local runtime ships its metrics into the deployed stack's own namespace.

``switchyard --stack NAME`` points the process at the stack's configuration (SSM: moto here), which
names the stack's namespace; the shipper installed after that sends every metric there (LocalStack's
CloudWatch), so the stack's alarms see them and another stack's do not. Processes of no stack keep
``Switchyard``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from switchyard.core import deployed_config, observability
from switchyard.core.deployed_config import (
    CONFIG_PATH_ENV,
    DEFAULT_METRICS_NAMESPACE,
    METRICS_NAMESPACE_ENV,
    config_path,
    metrics_namespace,
)
from switchyard.local import metrics_shipper
from tests.conftest import require_localstack, unique
from tests.local.test_metrics_shipper import FLUSH_S, client_for, settled, statistics
from tests.test_deployed_config import MOTO


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A deployed stack's configuration on moto, with only what this test reads."""
    name = unique("Ns").replace("_", "-")
    ssm = boto3.client("ssm", endpoint_url=MOTO, region_name="us-east-1")
    parameter = config_path(name) + METRICS_NAMESPACE_ENV
    ssm.put_parameter(Name=parameter, Value=metrics_namespace(name), Type="String", Overwrite=True)
    monkeypatch.setenv("AWS_ENDPOINT_URL", MOTO)
    monkeypatch.delenv("POWERTOOLS_METRICS_NAMESPACE", raising=False)
    monkeypatch.setenv(METRICS_NAMESPACE_ENV, "")  # recorded, so what the configuration sets is undone
    monkeypatch.delenv(METRICS_NAMESPACE_ENV)
    monkeypatch.setenv(CONFIG_PATH_ENV, config_path(name))
    deployed_config.forget()
    yield name
    monkeypatch.delenv(METRICS_NAMESPACE_ENV, raising=False)  # first: uninstalling reads it
    monkeypatch.delenv(CONFIG_PATH_ENV)  # and the configuration it is read over
    metrics_shipper.uninstall_metrics_shipper()
    observability.use_metrics_provider(None)
    deployed_config.forget()
    ssm.delete_parameter(Name=parameter)
    assert observability.metrics.namespace == DEFAULT_METRICS_NAMESPACE  # as later tests expect


def test_shipped_metrics_land_in_the_stack_namespace(stack: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cloudwatch: Any = client_for(require_localstack())
    with monkeypatch.context() as no_stack:
        no_stack.delenv(CONFIG_PATH_ENV)
        assert observability.metrics_namespace() == DEFAULT_METRICS_NAMESPACE
    own = metrics_namespace(stack)
    # read through the deployed configuration as values: nothing has to load it into the environment first
    assert observability.metrics_namespace() == own
    service = unique("svc")
    shipper = metrics_shipper.install_metrics_shipper(
        service, client=cloudwatch, settings=metrics_shipper.ShipperSettings(flush_interval_s=60))
    observability.metrics.add_metric(name="ProbeHandled", unit="Count", value=3)
    observability.metrics.flush_metrics()
    observability.emit_gauge("ProbeDepth", 7, "WorkerGroup", "g1")
    assert shipper.flush(FLUSH_S)
    dims = {"service": service}
    assert settled(cloudwatch, own, "ProbeHandled", dims, 3)["Sum"] == 3
    assert statistics(cloudwatch, own, "ProbeDepth", {"WorkerGroup": "g1", **dims})["Sum"] == 7
    assert statistics(cloudwatch, DEFAULT_METRICS_NAMESPACE, "ProbeHandled", dims)["Sum"] == 0
