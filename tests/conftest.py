"""Fixtures shared by every test: real services on 127.0.0.1 (started by ./dev)."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import pytest

# Started as a background job (``cmd &`` without job control), a run inherits SIGINT ignored, and
# so would every process the tests start and stop with Ctrl-C (a watch, a runtime): they would
# never stop. The tests' processes get Ctrl-C as in an interactive run.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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
    """Which RabbitMQ and Redis this run talks to (version from the management API), asked once.

    ``./dev test`` runs suites on single nodes and again on the clusters; the output must say which.
    """
    if BROKER not in config.stash:
        import requests

        from switchyard.core.config import Connections, service_urls

        conn = Connections.from_env()
        mgmt_urls, amqp_urls = service_urls(conn.management_url), service_urls(conn.amqp_url)
        mgmt, amqp = urlsplit(mgmt_urls[0]), urlsplit(amqp_urls[0])
        try:
            overview = requests.get(f"{mgmt.scheme}://{mgmt.hostname}:{mgmt.port}/api/overview", timeout=5,
                                    auth=(mgmt.username or "guest", mgmt.password or "guest")).json()
            version = f"RabbitMQ {overview['rabbitmq_version']} (Erlang {overview['erlang_version']})"
            nodes = len(requests.get(f"{mgmt.scheme}://{mgmt.hostname}:{mgmt.port}/api/nodes", timeout=5,
                                     auth=(mgmt.username or "guest", mgmt.password or "guest")).json())
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            version, nodes = f"RabbitMQ version unknown ({type(exc).__name__})", 0
        shape = f", a {nodes}-node cluster" if nodes > 1 else ""
        more = f" (+{len(amqp_urls) - 1} URLs)" if len(amqp_urls) > 1 else ""
        redis = urlsplit(conn.redis_url)
        redis_shape = "Redis Cluster" if conn.redis_cluster else "Redis"
        config.stash[BROKER] = (f"{version}{shape} at {amqp.hostname}:{amqp.port or 5672}{more}; "
                                f"{redis_shape} at {redis.hostname}:{redis.port or 6379}")
    return config.stash[BROKER]


TEST_CREDENTIALS = ("testing", "test")  # ./dev's (moto) and LocalStack's
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def aws_safety_problems(environ: Mapping[str, str]) -> list[str]:
    """Why an AWS call from this environment could reach real AWS (empty: it cannot)."""
    problems = []
    endpoints = {k: v for k, v in environ.items() if k.startswith("AWS_ENDPOINT_URL")}
    endpoints.setdefault("AWS_ENDPOINT_URL", "")  # unset: boto3 would call AWS itself
    for name, url in sorted(endpoints.items()):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.hostname not in LOOPBACK_HOSTS:
            problems.append(f"{name}={url!r} is not an http://127.0.0.1 or localhost URL")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        if environ.get(name) not in TEST_CREDENTIALS:
            problems.append(f"{name} is not one of the test credentials {TEST_CREDENTIALS}")
    problems += [f"{name} is set" for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN") if environ.get(name)]
    return problems


def pytest_configure(config: pytest.Config) -> None:
    """Fail fast if any AWS call could reach real AWS: every endpoint local, test credentials only."""
    problems = aws_safety_problems(os.environ)
    if problems:
        raise pytest.UsageError(
            "refusing to run: AWS calls could reach real AWS:\n  " + "\n  ".join(problems)
            + "\nRun the tests with ./dev test (it points AWS_ENDPOINT_URL at moto, with test credentials).")


def pytest_report_header(config: pytest.Config) -> str:
    return f"broker: {rabbitmq_broker(config)}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    # Also at the end: -q hides the header, and two runs' outputs must not be confused.
    terminalreporter.write_line(f"broker: {rabbitmq_broker(config)}")


LOCALSTACK_URL = os.environ.get("SWITCHYARD_LOCALSTACK_URL", "http://127.0.0.1:4566")


def require_localstack(url: str = LOCALSTACK_URL) -> str:
    """``url`` if LocalStack answers there; otherwise the test fails and says how to start it
    (``./dev services`` runs LocalStack like the other services: a missing one is an error)."""
    import requests

    try:
        requests.get(f"{url}/_localstack/health", timeout=3).raise_for_status()
    except requests.RequestException as exc:
        pytest.fail(f"LocalStack does not answer at {url} ({exc}); start it: ./dev services "
                    "(or scripts/localstack.sh start)")
    return url


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.1, what: str = "condition", *,
             ignoring: type[BaseException] | tuple[type[BaseException], ...] = (), required: bool = True):
    """Poll ``predicate`` until it returns something truthy; returns it, or fails the test.

    The tests' one wait for an event (tests/test_hygiene.py allows ``time.sleep`` here and, marked,
    where a window is held open): a fixed sleep is a race on a loaded machine, or slow on an idle one.
    ``ignoring``: exceptions that mean "not yet" (a service still starting); the last one is chained to
    the timeout. ``required=False``: on timeout return the last (falsy) value instead of failing.
    """
    import time

    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        value = None
        try:
            value = predicate()
        except ignoring as exc:
            last = exc
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            if not required:
                return value
            raise AssertionError(f"timed out after {timeout}s waiting for {what}") from last
        time.sleep(interval)


def blocked_in(thread, *functions: str) -> bool:
    """Whether ``thread`` is now inside every one of ``functions`` (names on its Python stack): a
    condition for ``wait_for`` where the event is "that thread is blocked there" (a poller in its pop,
    a caller waiting for a slot), which a fixed sleep only guessed."""
    import sys

    frame = sys._current_frames().get(thread.ident)
    names = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return set(functions) <= names
