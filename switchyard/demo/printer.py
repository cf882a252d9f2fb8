"""What every step of the demo prints through: a section title, then indented lines."""

from __future__ import annotations

import time


class Printer:
    """Flushes every line, so a person watching sees each step as it happens."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def section(self, title: str) -> None:
        print(f"\n{title}", flush=True)

    def line(self, text: str) -> None:
        print(f"  {text}", flush=True)
