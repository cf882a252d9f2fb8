"""Fixtures shared by every test: real services on 127.0.0.1 (started by ./dev)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

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


BROKER = pytest.StashKey[str]()


def rabbitmq_broker(config: pytest.Config) -> str:
    """Which RabbitMQ this run talks to (version from the management API), asked once per run.

    ``./dev test`` runs the RPC suites against two brokers (3.10 and 4.0); the output must say which.
    """
    if BROKER not in config.stash:
        import requests

        from switchyard.config import Connections

        conn = Connections.from_env()
        mgmt, amqp = urlsplit(conn.management_url), urlsplit(conn.amqp_url)
        try:
            overview = requests.get(f"{mgmt.scheme}://{mgmt.hostname}:{mgmt.port}/api/overview", timeout=5,
                                    auth=(mgmt.username or "guest", mgmt.password or "guest")).json()
            version = f"RabbitMQ {overview['rabbitmq_version']} (Erlang {overview['erlang_version']})"
        except (requests.RequestException, ValueError, KeyError) as exc:
            version = f"RabbitMQ version unknown ({type(exc).__name__})"
        config.stash[BROKER] = f"{version} at {amqp.hostname}:{amqp.port or 5672}"
    return config.stash[BROKER]


def pytest_report_header(config: pytest.Config) -> str:
    return f"broker: {rabbitmq_broker(config)}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    # Also at the end: -q hides the header, and two runs' outputs must not be confused.
    terminalreporter.write_line(f"broker: {rabbitmq_broker(config)}")


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
