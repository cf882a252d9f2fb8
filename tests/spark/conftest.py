"""Spark fixtures: one local SparkSession for the whole run; the RPC fixtures (pools, control planes) and
the delay fixtures (unique topics and schema) reused."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.delay.conftest import connections, output, settings, store  # noqa: F401 (fixtures)
from tests.rpc.conftest import _quiet_metrics, make_pool, planes, redis_client  # noqa: F401 (fixtures)

# local[2, 3]: two cores, and a failed task is tried up to 3 times (local mode ignores
# spark.task.maxFailures; the master URL carries it).
MASTER = "local[2,3]"


@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    """Started once (~6 s, more under load) for the Spark tests, stopped after them (its JVM holds
    ~1 GB the rest of the suite does not need); the tasks' Python workers import
    ``tests`` (test hooks travel by reference), hence the repository on their PYTHONPATH."""
    from switchyard.spark.job import build_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    session = build_session(MASTER, "switchyard-tests", {
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "1g", "spark.sql.adaptive.enabled": "false"})
    session.sparkContext.setLogLevel("ERROR")
    import pyspark

    # The JVM must be the Spark of the pyspark imported (scripts/spark35.sh runs these on 3.5.5).
    assert session.version == pyspark.__version__, (session.version, pyspark.__version__)
    yield session
    session.stop()


def pytest_report_header(config: pytest.Config) -> str:
    from importlib.metadata import version

    return f"pyspark: {version('pyspark')}"
