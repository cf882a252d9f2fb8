"""A small run of ``bench/scale_bench.py`` (the benchmark itself is not in the suite): every phase
measures something, and the run leaves no vhost behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import requests

from bench import scale_bench
from bench.stats import QUIET_ENVIRONMENT
from switchyard.rpc.settings import RpcSettings
from tests.conftest import unique

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_run_measures_every_phase_and_deletes_its_vhost(tmp_path: Path, monkeypatch) -> None:
    for name, value in QUIET_ENVIRONMENT.items():  # the run's own setting, undone after the test
        monkeypatch.setenv(name, value)
    # The bench counts the store's Redis commands through a single-node connection class: on the
    # clusters run its Redis is the single node (its RabbitMQ stays the cluster).
    monkeypatch.delenv("SWITCHYARD_REDIS_CLUSTER", raising=False)
    monkeypatch.delenv("SWITCHYARD_REDIS_URL", raising=False)
    vhost = unique("scale-smoke")
    out = tmp_path / "scale.json"
    assert scale_bench.main(["--sizes", "12", "--passes", "2", "--cold-keys", "1", "--calls", "5",
                             "--vhost", vhost, "--json", str(out)]) == 0
    [row] = json.loads(out.read_text())
    assert row["size"] == 12 and row["orphan_new_keys_per_s"] > 0 and row["activity_reports_per_s"] > 0
    assert row["reconciler"]["groups"] == 12 and row["reconciler"]["failed_passes"] == 0
    assert row["reconciler"]["mgmt_requests"] == 1  # one page: no unpaginated listing for 12 queues
    assert row["reconciler"]["redis_trips"] > 0
    assert row["broker"]["queues"] >= 12 and row["call_p50_ms"] > 0 and row["cold_start_p50_ms"] > 0
    base = RpcSettings.from_env().connections.management_url.split("@")[-1]
    gone = requests.get(f"http://{base}/api/vhosts/{vhost}", auth=("guest", "guest"), timeout=10)
    assert gone.status_code == 404


def test_importing_the_benchmarks_leaves_the_environment_alone() -> None:
    """A benchmark quiets metrics and logs when it runs, not when imported: the suite imports them
    for their smoke runs, and an import that set ``POWERTOOLS_METRICS_DISABLED`` turned metrics off
    for every later test of the session."""
    code = ("import os, bench.scale_bench, bench.control_plane_bench, bench.scale_store_bench, "
            "bench.scale_bus_pending_bench; "
            f"print(sorted(k for k in os.environ if k in {sorted(QUIET_ENVIRONMENT)!r}))")
    env = {k: v for k, v in os.environ.items() if k not in QUIET_ENVIRONMENT}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]"
