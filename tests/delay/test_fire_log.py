"""A fire run is logged at the level a person needs: the alarm scenario's seven ``fired 0, overdue
20`` runs are one warning (the backlog appeared) and then nothing above debug."""

from __future__ import annotations

import logging

import pytest

from switchyard.core.observability import logger
from switchyard.delay.fire_log import FireLog
from switchyard.delay.model import FireOutcome


def levels(log: FireLog, outcomes: list[FireOutcome], caplog: pytest.LogCaptureFixture) -> list[int]:
    caplog.set_level(logging.DEBUG, logger=logger.name)
    caplog.clear()
    for outcome in outcomes:
        log(outcome)
    return [r.levelno for r in caplog.records if r.getMessage().startswith("delay fire:")]


def test_a_repeated_unchanged_outcome_drops_to_debug(caplog: pytest.LogCaptureFixture) -> None:
    stuck = FireOutcome(fired=0, overdue=20)
    assert levels(FireLog(500), [stuck] * 7, caplog) == [logging.WARNING] + [logging.DEBUG] * 6


def test_quiet_runs_are_info_then_debug(caplog: pytest.LogCaptureFixture) -> None:
    idle = FireOutcome()
    assert levels(FireLog(500), [idle, idle, FireOutcome(readied=3, fired=3, max_late_ms=4), idle],
                  caplog) == [logging.INFO, logging.DEBUG, logging.INFO, logging.INFO]


def test_warns_when_overdue_grows_or_lateness_exceeds_the_sla(caplog: pytest.LogCaptureFixture) -> None:
    runs = [FireOutcome(overdue=5), FireOutcome(fired=5, overdue=2), FireOutcome(overdue=9),
            FireOutcome(fired=1, max_late_ms=501), FireOutcome(fired=1, max_late_ms=499),
            FireOutcome(overdue=-1)]  # -1: the count failed; not a growth
    assert levels(FireLog(500), runs, caplog) == [
        logging.WARNING, logging.INFO, logging.WARNING, logging.WARNING, logging.INFO, logging.INFO]
    assert "above the SLA" in caplog.records[3].getMessage()
    assert "overdue backlog grew" in caplog.records[2].getMessage()
