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
    # Seconds from a fault's end until every call it held up was answered (the slowest fault);
    # None where a scenario cannot measure it, or a call it held up was never answered.
    recovery: float | None = None
    # The strangers' scenario (malformed.py): malformed messages sent, those not accounted for (not
    # poisoned, parked or dropped with a reason, nor served), and consumers restarted more than once.
    bad: int = 0
    bad_lost: int = 0
    restarted: int = 0

    @classmethod
    def settle(cls, scenario: str, sent: Iterable[str], seen: Mapping[str, int], seconds: float,
               faults: int = 0, note: str = "", recovery: float | None = None) -> Account:
        """``seen[id]``: how many times ``id`` was answered / fired / handled (0 or absent: lost)."""
        counts = Counter(min(seen.get(i, 0), 2) for i in sent)
        return cls(scenario, sum(counts.values()), counts[1], counts[2], counts[0], seconds, faults, note,
                   recovery)

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.sent > 0 and self.once + self.duplicated + self.lost == self.sent
                and self.bad_lost == 0 and self.restarted == 0)


HEADER = ("scenario", "sent", "once", "duplicated", "lost", "faults", "time (s)", "recovery (s)", "bad",
          "bad lost", "restarted", "note")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(accounts: Iterable[Account]) -> str:
    """A plain-text table, one row per scenario, and a total line."""
    accounts = list(accounts)
    rows = [HEADER] + [
        (a.scenario, str(a.sent), str(a.once), str(a.duplicated), str(a.lost), str(a.faults),
         f"{a.seconds:.1f}", _seconds(a.recovery), str(a.bad), str(a.bad_lost), str(a.restarted), a.note)
        for a in accounts]
    recoveries = [a.recovery for a in accounts if a.recovery is not None]
    rows.append(("TOTAL", str(sum(a.sent for a in accounts)), str(sum(a.once for a in accounts)),
                 str(sum(a.duplicated for a in accounts)), str(sum(a.lost for a in accounts)),
                 str(sum(a.faults for a in accounts)), f"{sum(a.seconds for a in accounts):.1f}",
                 _seconds(max(recoveries, default=None)), str(sum(a.bad for a in accounts)),
                 str(sum(a.bad_lost for a in accounts)), str(sum(a.restarted for a in accounts)), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    numeric = range(1, 11)

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(rows[0]), rule, *(fmt(r) for r in rows[1:-1]), rule, fmt(rows[-1])])


def recovery_after(faults: Iterable[tuple[float, float]], sent_at: Mapping[str, float],
                   done_at: Mapping[str, float]) -> float | None:
    """Seconds from a fault's end until the last item it held up was done, the slowest fault.

    An item (a call, or a message by its deadline) is held up by a fault if it was sent (due)
    before the fault ended, or within a second after, and not done before the fault began. None if
    there was no fault or a held-up item was never done: the run did not recover. Both clocks are
    the caller's (monotonic or wall), the same for the faults and the items.
    """
    slowest = None
    for start, end in faults:
        held = [i for i, sent in sent_at.items() if sent <= end + 1.0 and done_at.get(i, end) >= start]
        if not held or any(i not in done_at for i in held):
            return None
        took = max(0.0, max(done_at[i] for i in held) - end)
        slowest = took if slowest is None else max(slowest, took)
    return slowest
