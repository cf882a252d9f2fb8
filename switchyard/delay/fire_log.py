"""One log line per ready-and-fire run, at the level a person needs.

A fire loop runs every minute (Lambda) or all the time (a local node): a line per run at warning
level would repeat ``fired 0, overdue 20`` until nobody reads it. So a run is logged at info when it
did something or its figures changed, at debug when nothing happened and nothing changed, and at
warning only when there is something to act on: the overdue backlog grew, or the run's worst timer
lateness exceeded the SLA (``SWITCHYARD_DELAY_LATENESS_SLA_MS``).
"""

from __future__ import annotations

import logging
import threading

from switchyard.core.observability import logger
from switchyard.delay.model import FireOutcome


class FireLog:
    """Remembers the previous run's figures (per process: a Lambda container, a local node)."""

    def __init__(self, lateness_sla_ms: int) -> None:
        self.lateness_sla_ms = lateness_sla_ms
        self._last: tuple[int, int] | None = None  # (fired, overdue) of the previous run
        self._lock = threading.Lock()

    def level(self, outcome: FireOutcome) -> int:
        """The level ``outcome`` deserves after the previous run (and remember it)."""
        figures = (outcome.fired, outcome.overdue)
        with self._lock:
            last, self._last = self._last, figures
        previous_overdue = last[1] if last is not None and last[1] >= 0 else 0
        if outcome.overdue > previous_overdue or outcome.max_late_ms > self.lateness_sla_ms:
            return logging.WARNING
        if outcome.fired == 0 and figures == last:
            return logging.DEBUG
        return logging.INFO

    def __call__(self, outcome: FireOutcome) -> None:
        """Log ``outcome`` at its level, with its figures as fields."""
        level = self.level(outcome)
        overdue = "unknown" if outcome.overdue < 0 else str(outcome.overdue)
        reason = ""
        if level == logging.WARNING:
            reason = ("; worst lateness above the SLA" if outcome.max_late_ms > self.lateness_sla_ms
                      else "; the overdue backlog grew (is the fire loop running and keeping up?)")
        write = {logging.DEBUG: logger.debug, logging.INFO: logger.info}.get(level, logger.warning)
        write(f"delay fire: fired {outcome.fired}, overdue at the end {overdue}, worst lateness "
              f"{outcome.max_late_ms:.0f} ms{reason}",
              extra={"fired": outcome.fired, "overdue": outcome.overdue,
                     "max_late_ms": outcome.max_late_ms, "lateness_sla_ms": self.lateness_sla_ms})
