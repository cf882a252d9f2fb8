"""Latency summaries (nearest-rank percentiles) for the demo and the benchmarks, and the sampling
buffer the RPC worker's activity reports and the delay fire loop's lateness windows share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values; ``q`` in [0, 100]."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass(frozen=True)
class LatencySummary:
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencySummary:
        ordered = sorted(seconds)
        return cls(
            count=len(ordered),
            p50_ms=percentile(ordered, 50) * 1000,
            p99_ms=percentile(ordered, 99) * 1000,
            max_ms=(ordered[-1] * 1000) if ordered else math.nan,
        )

    def __str__(self) -> str:
        return f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms, max {self.max_ms:.2f} ms"


class LatencySamples:
    """A window's latencies (ms), at most ``capacity`` of them: once full, each new one overwrites
    the oldest, so a busy window is summarized by its most recent figures while ``count`` counts them
    all. Costs a list write per value; the sort waits for ``take``. Not thread-safe: one owner."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.count = 0
        self._values: list[float] = []

    def add(self, value_ms: float) -> None:
        if self.count < self.capacity:
            self._values.append(value_ms)
        else:
            self._values[self.count % self.capacity] = value_ms
        self.count += 1

    def take(self) -> LatencySummary | None:
        """The window's count (all added) and the samples' p50, p99 and max in ms, then a new window
        (None: nothing was added)."""
        if not self.count:
            return None
        ordered = sorted(self._values)
        summary = LatencySummary(self.count, percentile(ordered, 50), percentile(ordered, 99), ordered[-1])
        self._values, self.count = [], 0
        return summary
