"""The account of a scenario: every request or message sent, and what became of it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Account:
    """``once + duplicated + lost == sent``; duplicates are allowed (at-least-once), losses are not."""

    scenario: str
    sent: int
    once: int
    duplicated: int
    lost: int
    seconds: float
    faults: int = 0
    note: str = ""

    @classmethod
    def settle(cls, scenario: str, sent: Iterable[str], seen: Mapping[str, int], seconds: float,
               faults: int = 0, note: str = "") -> Account:
        """``seen[id]``: how many times ``id`` was answered / fired / handled (0 or absent: lost)."""
        counts = Counter(min(seen.get(i, 0), 2) for i in sent)
        return cls(scenario, sum(counts.values()), counts[1], counts[2], counts[0], seconds, faults, note)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.sent > 0 and self.once + self.duplicated + self.lost == self.sent


HEADER = ("scenario", "sent", "once", "duplicated", "lost", "faults", "time (s)", "note")


def table(accounts: Iterable[Account]) -> str:
    """A plain-text table, one row per scenario, and a total line."""
    accounts = list(accounts)
    rows = [HEADER] + [
        (a.scenario, str(a.sent), str(a.once), str(a.duplicated), str(a.lost), str(a.faults),
         f"{a.seconds:.1f}", a.note) for a in accounts]
    rows.append(("TOTAL", str(sum(a.sent for a in accounts)), str(sum(a.once for a in accounts)),
                 str(sum(a.duplicated for a in accounts)), str(sum(a.lost for a in accounts)),
                 str(sum(a.faults for a in accounts)), f"{sum(a.seconds for a in accounts):.1f}", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    numeric = range(1, 7)

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(rows[0]), rule, *(fmt(r) for r in rows[1:-1]), rule, fmt(rows[-1])])
