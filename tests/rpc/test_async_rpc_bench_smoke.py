"""A small run of ``bench/async_rpc_bench.py`` (the benchmark itself is not in the suite): both sides
answer in both modes, a ratio to aio-pika's RPC pattern is printed for each, and the queues are gone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import requests

from switchyard.rpc.settings import RpcSettings
from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_run_prints_both_ratios_and_cleans_up() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "async_rpc_bench.py"), "--rounds", "1",
                          "--seconds", "0.3", "--in-flight", "8", "--queue-type", "classic"],
                         env=subprocess_env(SWITCHYARD_LOG_LEVEL="ERROR"), capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = run.stdout.split("median ratio switchyard / aio-pika RPC")[-1]
    ratios = dict(re.findall(r"^\s+(sequential|concurrent)\s+([0-9.]+)$", summary, re.MULTILINE))
    assert set(ratios) == {"sequential", "concurrent"}, run.stdout
    assert all(float(r) > 0 for r in ratios.values()), run.stdout
    pool = re.search(r"\(pool (bench_[0-9a-f]{6})\)", run.stdout)
    assert pool is not None, run.stdout
    management = RpcSettings.from_env().connections.management_url.split(",")[0]
    base, auth = management.split("@")[-1], tuple(management.split("//")[1].split("@")[0].split(":"))
    queues = requests.get(f"http://{base}/api/queues", auth=auth, timeout=10).json()
    assert [q["name"] for q in queues if q["name"].startswith(pool.group(1))] == []
