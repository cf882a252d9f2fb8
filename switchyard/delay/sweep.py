"""Failure detection and recovery (seed, operation 3): reset rows readied longer ago than the hold time.

Two queries, as in the seed: read the stuck rows, then reset each with a compare-and-set on the
values read (readied_at, readied_by), so a row whose node made progress, or that a peer already
reset, is left alone, and each reset names the node suspected of failure.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from switchyard.core.observability import logger
from switchyard.delay.errors import StoreError
from switchyard.delay.model import SweepOutcome
from switchyard.delay.ports import DelayStore
from switchyard.delay.settings import DelaySettings

SWEEP_LIMIT = 5000


def sweep_once(store: DelayStore, settings: DelaySettings) -> tuple[int, int]:
    """One detection pass; returns (rows suspected, rows reset)."""
    stuck = store.find_stuck(settings.hold_time, SWEEP_LIMIT)
    reset = store.reset_stuck(stuck)
    for s in reset:
        logger.warning(f"suspected failure of {s.readied_by} for message {s.id}",
                       extra={"message_id": s.id, "readied_by": s.readied_by})
    return len(stuck), len(reset)


def run_sweeps(store: DelayStore, settings: DelaySettings, remaining_ms: Callable[[], int]) -> SweepOutcome:
    """Sweep every failure detection interval until the invocation's remaining time runs short."""
    interval_s = settings.failure_detection_interval_ms / 1000
    scans = suspected = reset = errors = 0
    while True:
        started = time.monotonic()
        try:
            found, done = sweep_once(store, settings)
            suspected, reset = suspected + found, reset + done
        except StoreError as exc:
            errors += 1
            logger.warning("failure detection pass failed; retrying", extra={"error": str(exc)})
        scans += 1
        wake = started + interval_s * random.uniform(0.9, 1.1)
        while time.monotonic() < wake:
            if remaining_ms() <= settings.failure_detection_interval_ms + 500:
                return SweepOutcome(scans, suspected, reset, errors)
            time.sleep(min(0.25, max(0.0, wake - time.monotonic())))  # checks for stop between
