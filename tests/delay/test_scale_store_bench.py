"""A small run of ``bench/scale_store_bench.py`` (the benchmark itself is not in the suite): it
measures each figure and drops its database."""

from __future__ import annotations

import json

import psycopg
import pytest

from bench import scale_store_bench
from switchyard.core.config import Connections
from tests.conftest import unique


def test_a_small_run_measures_and_drops_its_database(capsys: pytest.CaptureFixture[str]) -> None:
    database = unique("scale_smoke")
    assert scale_store_bench.main(["--rows", "2000", "4000", "--rounds", "1", "--database", database]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["rows"] for r in rows] == [2000, 4000]
    for row in rows:
        assert all(row[f"{step}_ms_per_1000"] > 0 for step in ("enqueue", "ready", "delete"))
        assert row["waiting_index_mb_per_million"] > 0 and row["vacuum_s"] >= 0
    with psycopg.connect(Connections.from_env().postgres_dsn) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
    assert found is None
