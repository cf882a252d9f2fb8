"""The rpc part's metric names: what the handlers emit is what ``switchyard.rpc.metrics`` names."""

from __future__ import annotations

from typing import Any

import pytest

from switchyard.core import observability
from switchyard.rpc import metrics
from switchyard.rpc.control.activity import ActivityOutcome
from switchyard.rpc.control.dead_letters import DeadLetterOutcome
from switchyard.rpc.control.orphans import OrphanOutcome
from switchyard.rpc.control.reconciler import ReconcileOutcome
from switchyard.rpc.control.scheduled import ScheduledOutcome

OUTCOMES = [
    (OrphanOutcome, metrics.ORPHAN_PREFIX),
    (DeadLetterOutcome, metrics.DEAD_LETTER_PREFIX),
    (ActivityOutcome, metrics.ACTIVITY_PREFIX),
    (ReconcileOutcome, metrics.RECONCILE_PREFIX),
    (ScheduledOutcome, metrics.SCHEDULED_PREFIX),
]

# What the alarms and the dashboard in stacks/ select on.
ALARMED = {
    "DeadLetterPoisoned", "DeadLetterExpired", "DeadLetterRejected", "DeadLetterMaxlen",
    "DeadLetterDeadLetters", "DeadLetterResponses", "DeadLetterWithoutReason", "DeadLetterDeliveryLimit",
    "OrphanForwarded", "OrphanNewGroups", "OrphanGroupStartFailures", "ReconcileGroupsStarted",
    "ReconcileGroupsStopped", "ReconcileDriverErrors", "ReconcileDeadLetteringStranded", "QueueDepth",
}


class _Sink:
    def __init__(self) -> None:
        self.names: list[str] = []

    def add_metric(self, name: str, **_: Any) -> None:
        self.names.append(name)


@pytest.mark.parametrize(("outcome_class", "prefix"), OUTCOMES, ids=lambda v: getattr(v, "__name__", v))
def test_every_count_emit_counts_derives_is_named(monkeypatch: pytest.MonkeyPatch, outcome_class: type,
                                                  prefix: str) -> None:
    sink = _Sink()
    monkeypatch.setattr(observability, "metrics", sink)
    observability.emit_counts(outcome_class(), prefix=prefix)
    assert sink.names, f"{outcome_class.__name__} emits nothing"
    assert set(sink.names) <= metrics.EMITTED, set(sink.names) - metrics.EMITTED


def test_emitted_holds_what_is_emitted_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every name in EMITTED comes out of an outcome (or is the reconciler's QueueDepth gauge), and
    every name the alarms use is among them."""
    sink = _Sink()
    monkeypatch.setattr(observability, "metrics", sink)
    for outcome_class, prefix in OUTCOMES:
        observability.emit_counts(outcome_class(), prefix=prefix)
    assert {*sink.names, metrics.QUEUE_DEPTH} == metrics.EMITTED
    assert metrics.EMITTED >= ALARMED, ALARMED - metrics.EMITTED


def test_each_constant_is_its_name_in_upper_snake_case() -> None:
    import re

    constants = {k: v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str)}
    for name in metrics.EMITTED:
        key = re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()
        assert constants.get(key) == name, key
