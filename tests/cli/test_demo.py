"""``switchyard demo``'s steps print only their own lines: the handlers they run in its process are
called hundreds of times, and none of their metrics reaches stdout."""

from __future__ import annotations

import json

import pytest

from switchyard.cli.main import SHIP_ENV, metrics_routed
from switchyard.demo import Printer, delay_scheduler_part


def emf_lines(text: str) -> list[str]:
    """The lines of ``text`` that are EMF documents (Powertools' metric blobs)."""
    found = []
    for line in text.splitlines():
        try:
            document = json.loads(line)
        except ValueError:
            continue
        if isinstance(document, dict) and "_aws" in document:
            found.append(line[:200])
    return found


def test_the_delay_step_prints_its_report_and_no_metrics(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """300 messages through the enqueue bridge, the fire loop and the scheduled-call relay (about a
    hundred relay invocations: Powertools printed its set at a metric's 100th value)."""
    monkeypatch.delenv(SHIP_ENV, raising=False)
    with metrics_routed():  # as `switchyard demo` runs: metrics off
        delay_scheduler_part(Printer())
    out = capsys.readouterr().out
    assert not emf_lines(out), emf_lines(out)
    assert "fired 300 of 300, 300 exactly once" in out, out
