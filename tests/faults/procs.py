"""Processes the scenarios start and kill: ``switchyard local``, ``switchyard delay run``, workers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import subprocess_env, wait_for


def pids_with_env(name: str, value: str) -> list[int]:
    """Every live process whose environment has ``name=value`` (e.g. the workers of one pool)."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> int:
    killed = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            killed += 1
    return killed


class Service:
    """A ``python -m switchyard ...`` subprocess that a scenario SIGKILLs and starts again.

    Every start carries ``SWITCHYARD_FAULTS_TAG``, so whatever it spawned (workers, which outlive a
    SIGKILLed parent) can be found and reaped at the end.
    """

    def __init__(self, args: list[str], env: dict[str, str], log: Path, tag: str) -> None:
        self.args = args
        self.env = subprocess_env(SWITCHYARD_FAULTS_TAG=tag, **env)
        self.log = log
        self.tag = tag
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Service:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "switchyard", *self.args], env=self.env,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        self.starts += 1
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sigkill(self) -> None:
        """SIGKILL: no handler runs, nothing is settled, children are left behind."""
        assert self.proc is not None and self.alive(), f"{self.args[0]} is not running; see {self.log}"
        self.proc.kill()
        self.proc.wait(10)

    def sigkill_holding(self, holding: Callable[[], bool], what: str, down_s: float) -> tuple[float, float]:
        """SIGKILL once ``holding()`` says it has work in hand, start it again ``down_s`` later.
        Returns when it was killed and when it was started again (time.monotonic())."""
        wait_for(holding, timeout=30, interval=0.005, what=what)
        self.sigkill()
        killed = time.monotonic()
        time.sleep(down_s)  # pace: the process stays down for down_s
        self.start()
        return killed, time.monotonic()

    def stop(self) -> None:
        """SIGTERM (a clean stop), SIGKILL after 20 s; then reap anything it left behind."""
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        kill_pids(pids_with_env("SWITCHYARD_FAULTS_TAG", self.tag))
