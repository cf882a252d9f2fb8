"""A new key's first call waits for its worker to start, under the request's expiration (issue 22,
item 11): answered when the expiration outlives the start, expired when it does not.

This is the local mirror of a first call on AWS, where the start is a Fargate task's (tens of
seconds, stacks/constants.py's estimate) and the deployment's default timeout is sized for it
(tests/stacks/test_first_call.py). Here a worker takes ``START_S`` to start.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.rpc import protocol
from switchyard.rpc.client import RpcClient
from switchyard.rpc.errors import CallTimeoutError
from tests.conftest import subprocess_env
from tests.rpc.conftest import WORKER_COMMAND, CountingDriver

pytestmark = pytest.mark.slow

START_S = 3.0
WHOAMI = "tests.rpc.handlers:whoami"


def slow_start_driver(tmp_path: Path) -> CountingDriver:
    """Workers that sleep ``START_S`` before they start, as a task that is still being placed and pulled."""
    command = ["sh", "-c", f'sleep {START_S}; exec "$0" "$@"', *WORKER_COMMAND, WHOAMI]
    return CountingDriver(command, min_workers=1, max_workers=1, log_dir=tmp_path / "workers",
                          stop_timeout=10, env=subprocess_env(WORKER_ACTIVITY_INTERVAL="0.2"))


def test_a_first_call_is_answered_when_its_expiration_outlives_the_start(make_pool, planes, tmp_path) -> None:
    pool, settings = make_pool()
    planes.start(pool, settings, driver=slow_start_driver(tmp_path))
    with RpcClient(pool, settings) as client:
        try:
            short = client.call("short-lived", "hello", timeout=START_S / 3)
        except CallTimeoutError:
            short = None
        assert short is None or short.status == protocol.Status.EXPIRED, short  # never a worker's answer
        answered = client.call("long-lived", "hello", timeout=START_S * 4)
    assert answered.ok, answered
    assert answered.text().split("|", 2)[1:] == ["long-lived", "hello"]
