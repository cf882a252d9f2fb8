"""The delay scheduler's metric names: defined once (``switchyard.delay.metrics``), and every reported
outcome field maps to one of them, so renaming a field fails here rather than silencing an alarm."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

import pytest

from switchyard.delay import metrics
from switchyard.delay.model import Drop, DropReason, EnqueueOutcome, FireOutcome, RecordPosition, SweepOutcome

# Counts an outcome carries that no metric reports (logged or used by the CLI only).
NOT_REPORTED = {FireOutcome: {"deleted", "released"}, SweepOutcome: {"scans", "suspected"}}


def problems(cls: type, reported: Mapping[str, str], not_reported: set[str] = frozenset()) -> list[str]:
    """What is wrong with one outcome's table: a field it names that the class lacks, a name not in
    EMITTED, or a field of the class neither reported nor known to be left out."""
    names = {f.name for f in fields(cls)}
    found = [f"{cls.__name__} has no field {field!r}" for field in reported if field not in names]
    found += [f"{name} is not in EMITTED" for name in reported.values() if name not in metrics.EMITTED]
    found += [f"{cls.__name__}.{name} is not reported" for name in names - set(reported) - not_reported]
    return found


@pytest.mark.parametrize("cls", [EnqueueOutcome, FireOutcome, SweepOutcome], ids=lambda c: c.__name__)
def test_every_reported_field_of_an_outcome_maps_to_an_emitted_name(cls: type) -> None:
    assert problems(cls, metrics.REPORTED[cls], NOT_REPORTED.get(cls, set())) == []


def test_renaming_an_outcome_field_fails_the_check() -> None:
    @dataclass
    class Renamed:  # SweepOutcome with ``reset`` renamed
        scans: int = 0
        suspected: int = 0
        resets: int = 0
        store_errors: int = 0

    found = problems(Renamed, metrics.SWEEP_FIELDS, NOT_REPORTED[SweepOutcome])
    assert "Renamed has no field 'reset'" in found and "Renamed.resets is not reported" in found


def test_names_are_constants_in_upper_snake_form_and_all_are_reported() -> None:
    constants = {name: value for name, value in vars(metrics).items()
                 if name.isupper() and isinstance(value, str)}
    assert set(constants.values()) == metrics.EMITTED
    for name, value in constants.items():
        assert name == re.sub(r"(?<!^)(?=[A-Z])", "_", value).upper(), name
    assert {n for table in metrics.REPORTED.values() for n in table.values()} == metrics.EMITTED


def test_each_report_adds_its_outcome_as_the_handlers_did(monkeypatch: pytest.MonkeyPatch) -> None:
    added: list[tuple[str, str, float]] = []
    monkeypatch.setattr(metrics.metrics, "add_metric",
                        lambda name, unit, value: added.append((name, unit.value, value)))
    drop = Drop("t", 0, 1, DropReason.MALFORMED_RECORD, "x")
    metrics.report_enqueue(EnqueueOutcome(5, 2, 1, 1, (drop,), (RecordPosition("t", 0, 2),)))
    assert added == [("DelayRecordsReceived", "Count", 5), ("DelayMessagesEnqueued", "Count", 2),
                     ("DelayDuplicatesIgnored", "Count", 1), ("DelayFiredImmediately", "Count", 1),
                     ("DelayRecordsDropped", "Count", 1), ("DelayRecordsRetried", "Count", 1)]
    added.clear()
    metrics.report_fire(FireOutcome(readied=3, fired=2, max_late_ms=1.5, overdue=-1))
    assert ("DelayMaxTimerLateness", "Milliseconds", 1.5) in added
    assert "DelayMessagesOverdue" not in {name for name, _, _ in added}  # -1: not counted
    added.clear()
    metrics.report_fire(FireOutcome(overdue=4))
    assert ("DelayMessagesOverdue", "Count", 4) in added and len(added) == 8
    added.clear()
    metrics.report_sweep(SweepOutcome(scans=9, suspected=3, reset=2, store_errors=1))
    assert added == [("DelaySuspectedFailures", "Count", 2), ("DelayStoreErrors", "Count", 1)]
