"""A small run of ``bench/scale_bus_pending_bench.py`` (the benchmark itself is not in the suite):
each figure is measured and no key of the run is left in Redis."""

from __future__ import annotations

import json

import pytest

from bench import scale_bus_pending_bench
from bench.stats import QUIET_ENVIRONMENT
from switchyard.core.redis_client import connect_redis


def test_a_small_run_measures_and_leaves_no_key(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    for name, value in QUIET_ENVIRONMENT.items():  # the run's own setting, undone after the test
        monkeypatch.setenv(name, value)
    assert scale_bus_pending_bench.main(["--subscribers", "3", "--endpoints", "5"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    bus, pending = rows[0]["bus"], rows[1]["pending"]
    assert bus["subscribers"] == 3 and bus["bytes_per_subscriber"] > 0 and bus["housekeeping_ms"] > 0
    assert pending["endpoints"] == 5 and pending["bytes_per_endpoint"] > 0 and pending["keys"] >= 5
    client = connect_redis()
    assert not list(client.scan_iter(match="switchyard:bus:{scale*", count=1000))
