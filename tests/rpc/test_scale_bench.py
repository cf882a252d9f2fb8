"""A small run of ``bench/scale_bench.py`` (the benchmark itself is not in the suite): every phase
measures something, and the run leaves no vhost behind."""

from __future__ import annotations

import json
from pathlib import Path

import requests

from bench import scale_bench
from switchyard.rpc.settings import RpcSettings
from tests.conftest import unique


def test_a_small_run_measures_every_phase_and_deletes_its_vhost(tmp_path: Path) -> None:
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
