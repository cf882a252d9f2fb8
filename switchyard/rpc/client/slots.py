"""The slot table of the slotted client design's slotted client.

A fixed array sized by the client's concurrency. A call takes a free slot and a fresh sequence
number; its correlation id carries both. A response completes a call only if the slot still
holds that sequence number, so a late response to a timed-out call can never complete the call
that reuses its slot. Free slots are kept on a pre-allocated stack (the seed's cheapest option),
so taking and freeing a slot is O(1).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class Slot(Generic[T]):
    seq: int = 0
    waiter: T | None = None
    sent_at: float = 0.0


class SlotTable(Generic[T]):
    """Thread-safe: callers take slots, the I/O thread completes and expires them."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a client needs at least one slot")
        self.size = size
        self._slots: list[Slot[T]] = [Slot() for _ in range(size)]
        self._free: list[int] = list(range(size - 1, -1, -1))
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)

    def in_use(self) -> int:
        return self.size - len(self._free)

    def acquire(self, waiter: T, wait: float | None) -> tuple[int, int] | None:
        """Take a free slot for ``waiter``: returns ``(slot, seq)``, or None if none freed in ``wait`` s."""
        deadline = None if wait is None else time.monotonic() + wait
        with self._lock:
            while not self._free:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._freed.wait(remaining)
            index = self._free.pop()
            slot = self._slots[index]
            slot.seq = next(self._seq)
            slot.waiter = waiter
            slot.sent_at = time.monotonic()
            return index, slot.seq

    def holds(self, index: int, seq: int) -> bool:
        """Whether call ``seq`` still occupies slot ``index`` (read without the lock: a hint)."""
        slot = self._slots[index]
        return slot.waiter is not None and slot.seq == seq

    def complete(self, index: int, seq: int) -> T | None:
        """Free the slot if it still belongs to call ``seq``; returns that call's waiter."""
        if not 0 <= index < self.size:
            return None
        with self._lock:
            slot = self._slots[index]
            if slot.waiter is None or slot.seq != seq:
                return None
            waiter, slot.waiter = slot.waiter, None
            self._free.append(index)
            self._freed.notify()
            return waiter

    def live(self) -> list[T]:
        """The waiters of the calls in flight, oldest first (a lost connection re-sends them)."""
        with self._lock:
            held = sorted((slot.seq, slot.waiter) for slot in self._slots if slot.waiter is not None)
            return [waiter for _, waiter in held]

    def drain(self) -> list[T]:
        """Free every slot (client closing or connection lost); returns the waiters."""
        with self._lock:
            waiters = []
            for index, slot in enumerate(self._slots):
                if slot.waiter is not None:
                    waiters.append(slot.waiter)
                    slot.waiter = None
                    self._free.append(index)
            self._freed.notify_all()
            return waiters
