"""``bench.delay_bench`` writes where ``--out`` says: its per-rate files go beside the results."""

from __future__ import annotations

from pathlib import Path

from bench.delay_bench import ROOT, work_dir


def test_the_work_directory_follows_out(tmp_path: Path) -> None:
    assert work_dir(tmp_path / "run.json") == tmp_path / "results" / "run"
    assert not work_dir(tmp_path / "run.json").is_relative_to(ROOT)


def test_the_default_stays_in_the_ignored_results_directory() -> None:
    assert work_dir(ROOT / "bench" / "delay_results.json").is_relative_to(ROOT / "bench" / "results")
