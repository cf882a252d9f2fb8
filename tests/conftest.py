"""Fixtures shared by every test: real services on 127.0.0.1 (started by ./dev)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: the repo importable, logs visible in test output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("SWITCHYARD_LOG_LEVEL", "WARNING")
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; returns it, or fails the test."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
