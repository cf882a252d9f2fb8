"""``switchyard pending serve|call|status`` as real processes: serve is node B, call is node A."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading

import requests

from switchyard.pending import CancelToken, PendingSettings
from switchyard.pending.client import PollingService
from tests.conftest import subprocess_env, wait_for
from tests.pending.conftest import NodeFactory, free_port


def cli(settings: PendingSettings, *args: str, **extra: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of ``switchyard pending ARGS`` on the test's prefix."""
    env = subprocess_env(SWITCHYARD_PENDING_PREFIX=settings.prefix, POWERTOOLS_METRICS_DISABLED="true",
                         **extra)
    return [sys.executable, "-m", "switchyard", "pending", *args], env


def run(settings: PendingSettings, *args: str) -> subprocess.CompletedProcess:
    command, env = cli(settings, *args)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_serve_and_call_through_a_polling_service(settings: PendingSettings, shared_redis) -> None:
    port = free_port()
    command, env = cli(settings, "serve", "--port", str(port),
                       SWITCHYARD_PENDING_TOKENS=json.dumps({"echo": "tok"}))
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        assert "serving polling services" in server.stdout.readline()
        assert requests.get(f"{url}/health", timeout=5).json()["ok"] is True
        with PollingService(url, "echo", "tok", lambda request: {"echo": request.body}, settings=settings):
            done = run(settings, "call", "--endpoint", "echo", "--body", '{"n": 7}')
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["body"] == {"echo": {"n": 7}}
    finally:
        server.terminate()
        server.wait(15)
    assert server.returncode == 0


def test_call_errors_are_clear(settings: PendingSettings, shared_redis) -> None:
    done = run(settings, "call", "--endpoint", "nobody", "--body", "hi", "--pickup-timeout", "0.5")
    assert done.returncode == 1
    assert "no polling service took it within the pickup timeout" in done.stderr
    done = run(settings, "call", "--endpoint", "bad{name}")
    assert done.returncode != 0 and "endpoint must match" in done.stderr


def test_status_shows_depth_in_flight_and_oldest_age(settings: PendingSettings,
                                                     make_node: NodeFactory) -> None:
    caller = make_node()
    cancel = CancelToken()
    threading.Thread(target=_quiet, args=(caller.queue_and_wait, "waiting", 1),
                     kwargs={"cancel": cancel, "pickup_timeout": 120}, daemon=True).start()
    wait_for(lambda: caller.status().get("waiting"), what="the request to be queued")
    try:
        status = json.loads(run(settings, "status", "--json").stdout)
        table = run(settings, "status").stdout
    finally:
        cancel.cancel()
    (waiting,) = status["endpoints"]
    assert [waiting[f] for f in ("endpoint", "waiting", "queued", "taken")] == ["waiting", 1, 1, 0]
    assert 0 <= waiting["oldest_age_s"] < 60  # whole-clock resolution: a fresh request may read 0.0
    assert table.splitlines()[0].split() == ["endpoint", "waiting", "queued", "taken", "answered", "oldest"]
    assert table.splitlines()[1].split()[:5] == ["waiting", "1", "1", "0", "0"]


def _quiet(fn, *args, **kwargs) -> None:
    with contextlib.suppress(Exception):
        fn(*args, **kwargs)
