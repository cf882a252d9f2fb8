"""What every step of the demo prints through: a section title, then indented lines."""

from __future__ import annotations

import time

from switchyard.cli.options import show


class Printer:
    """Flushes every line, so a person watching sees each step as it happens."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def section(self, title: str) -> None:
        show("", title, flush=True)

    def line(self, text: str) -> None:
        show(f"  {text}", flush=True)
