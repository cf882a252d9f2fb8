"""The bus's metrics contract: every name it emits is a constant of ``switchyard.bus.metrics``
(named as the UPPER_SNAKE form of its value) and in ``EMITTED``, including the names derived from
outcome dataclasses and the worker's counters, so renaming a field fails here, not in an alarm."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from switchyard.bus import metrics as bus_metrics
from switchyard.bus.delivery import OUTCOMES
from switchyard.bus.housekeeping import HousekeepingOutcome
from switchyard.core import observability


def _upper_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def test_every_constant_is_named_after_its_metric_and_emitted() -> None:
    constants = {k: v for k, v in vars(bus_metrics).items() if k.startswith("BUS_")}
    assert constants and all(_upper_snake(v) == k for k, v in constants.items())
    assert frozenset(constants.values()) == bus_metrics.EMITTED


def _captured(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    monkeypatch.setattr(observability.metrics, "add_metric", lambda name, **_: names.append(name))
    return names


def test_the_housekeeping_functions_outcome_counts_are_emitted_names(monkeypatch) -> None:
    names = _captured(monkeypatch)
    outcome = HousekeepingOutcome(**{f.name: 1 for f in fields(HousekeepingOutcome)})
    observability.emit_counts(outcome, prefix=bus_metrics.HOUSEKEEPING_PREFIX)
    assert len(names) == len(fields(HousekeepingOutcome))
    assert set(names) <= bus_metrics.EMITTED


def test_every_worker_counter_has_an_emitted_name(monkeypatch) -> None:
    from switchyard.bus.worker import BusWorker, WorkerStats

    counted = {f"deliveries_{outcome}" for outcome in OUTCOMES} | {
        "events_delivered", "aux_jobs", "job_errors", "threads_started"}
    assert counted == set(bus_metrics.WORKER_COUNTERS)
    names = _captured(monkeypatch)
    monkeypatch.setattr(observability.metrics, "flush_metrics", lambda *a, **k: None)
    worker = BusWorker.__new__(BusWorker)  # flush_metrics needs only its counts
    worker.stats, worker._flushed = WorkerStats(), {}
    worker.stats.add(**dict.fromkeys(counted, 1))
    worker.flush_metrics()
    assert set(names) == set(bus_metrics.WORKER_COUNTERS.values()) <= bus_metrics.EMITTED


def test_no_metric_name_is_typed_at_an_emit_site() -> None:
    package = Path(bus_metrics.__file__).parent
    modules = [m for m in package.glob("*.py") if m.name != "metrics.py"]
    modules += list((package.parents[1] / "functions").glob("bus_*.py"))
    for module in modules:
        source = module.read_text()
        assert not re.search(r"(add_metric\(name=|emit_gauge\(|metric_prefix=)\s*[\"']", source), module.name
        assert not any(f'"{name}"' in source for name in bus_metrics.EMITTED), module.name
