"""Measurements shared by the delay benchmark and its peers (standard library only: the peers run in
their own virtual environment, without the project's dependencies)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BUSY_CORE = "1"


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 / p99 / p99.9 / max / min (nearest rank) of a list, in the list's unit."""
    if not values:
        return {}
    s = sorted(values)

    def rank(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))]

    return {"p50": rank(50), "p99": rank(99), "p99.9": rank(99.9), "max": s[-1], "min": s[0]}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process (all its threads) has used so far; NaN once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listener_pid(port: int) -> int | None:
    """The pid of the local server listening on ``port`` (the broker, Redis): its CPU is reported."""
    try:
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    start = out.find("pid=")
    return int(out[start + 4:].split(",", 1)[0]) if start >= 0 else None


def lateness_summary(rows: list[tuple[str, float, float]], sent: int, window: tuple[float, float],
                     ) -> dict[str, object]:
    """From (id, due ms, done ms) rows: sustained rate in the steady window, lateness, lost, duplicates."""
    unique = {r[0] for r in rows}
    w0, w1 = window
    in_window = sum(1 for r in rows if w0 <= r[2] / 1000 < w1)
    return {
        "received": len(rows), "lost": sent - len(unique), "duplicates": len(rows) - len(unique),
        "sustained_per_s": round(in_window / (w1 - w0), 1) if w1 > w0 else None,
        "lateness_ms": {k: round(v, 2) for k, v in percentiles([r[2] - r[1] for r in rows]).items()},
    }


QUIET_ENVIRONMENT = {"POWERTOOLS_METRICS_DISABLED": "true", "SWITCHYARD_LOG_LEVEL": "ERROR"}


def quiet_environment() -> None:
    """A benchmark prints its results only. Set when it runs, not when imported: a test that
    imports a benchmark (its smoke run) must not turn metrics and logs off for the whole session."""
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def busy_load(on: bool) -> subprocess.Popen[bytes] | None:
    """The reproducible "other core busy": one process spinning on core 1 (taskset), from start to end."""
    if not on:
        return None
    return subprocess.Popen(["taskset", "-c", BUSY_CORE, sys.executable, "-c", "while True: pass"])
