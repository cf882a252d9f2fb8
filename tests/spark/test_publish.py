"""The publish job end to end on local[2]: real RabbitMQ, workers started by the local control plane."""

from __future__ import annotations

import json
import time
from pathlib import Path

from switchyard.spark import rows as r
from switchyard.spark.job import PublishOptions, run

ECHO = "tests.rpc.handlers:control_plane_echo"


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def results(spark, output: Path, name: str = "results") -> list:
    return spark.read.parquet(str(output / name)).collect()


def test_ten_thousand_rows_over_a_hundred_new_keys_are_all_answered_once(
        spark, make_pool, planes, tmp_path: Path) -> None:
    pool, settings = make_pool()
    planes.start(pool, settings, handler=ECHO)
    rows = [{"key": f"key-{i % 100}", "body": f"row-{i}"} for i in range(10_000)]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    lines: list[str] = []
    started = time.monotonic()
    summary = run(spark, PublishOptions(source, str(tmp_path / "out"), pool=pool, timeout_s=60,
                                        progress_interval_s=2), report=lines.append)
    elapsed = time.monotonic() - started
    written = results(spark, tmp_path / "out")
    expected = {r.stable_id(pool, row["key"], row["body"].encode(), None): row for row in rows}
    assert len(written) == 10_000
    assert {row.id for row in written} == set(expected)
    for row in written:
        assert (row.status, row.pool, row.key) == ("ok", pool, expected[row.id]["key"]), row
        assert row.response == expected[row.id]["body"].encode()
        assert row.attempts >= 1 and row.latency_ms > 0
    assert summary.counts == {(pool, "ok"): 10_000} and summary.bad == {}
    assert "10,000/10,000 rows" in lines[-2], lines
    print(f"\n10,000 rows over 100 new keys: {10_000 / elapsed:,.0f} rows/s end to end "
          f"({elapsed:.1f} s incl. reading and writing); {summary}")
