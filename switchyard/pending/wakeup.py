"""A one-bit wake-up for one waiting thread, cheaper than ``threading.Event`` on the hot path."""

from __future__ import annotations

import contextlib
import threading


class Signal:
    """Wakes one waiting thread: ``set`` wakes it, ``wait`` consumes the wake-up. An Event that
    clears itself, on one bare lock: Event's Condition costs a lock allocation and more on every
    wait, paid twice per call (the caller's wait for its response, a combined call's wait)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # already set, not yet consumed
            self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """True if woken (the wake-up is consumed), False after ``timeout`` seconds."""
        return self._lock.acquire(timeout=-1 if timeout is None else timeout)

    def is_set(self) -> bool:
        """Set and not yet consumed: the waiting thread is about to wake."""
        return not self._lock.locked()
