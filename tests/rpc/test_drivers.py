"""Worker group drivers: pure rules alone, the subprocess driver with real workers on the real RabbitMQ."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from switchyard.core import tracing
from switchyard.core.errors import ConfigError, InvalidNameError
from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.client import RpcClient
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.drivers import (
    DriverError,
    DriverSettings,
    NoopDriver,
    SubprocessDriver,
    WorkerGroup,
    desired_workers,
    driver_from_env,
)
from switchyard.rpc.ports import GROUP_ID_RE
from switchyard.rpc.settings import DEMO_HANDLER, RpcSettings
from switchyard.rpc.worker.examples import INTENDED_CRASH_EXIT
from tests.conftest import subprocess_env, wait_for
from tests.rpc.test_protocol import ODD_KEYS

COMMAND = (sys.executable, "-m", "switchyard", "worker", "--handler", "switchyard.rpc.examples:describe")


# -- pure -------------------------------------------------------------------------------------
def test_group_id_is_safe_deterministic_and_distinct_for_odd_keys() -> None:
    keys = [*ODD_KEYS, "🚂" * 300]
    ids = [WorkerGroup("core", key).group_id for key in keys]
    assert all(GROUP_ID_RE.match(group_id) and len(group_id) <= 255 for group_id in ids), ids
    assert len(set(ids)) == len(keys)
    assert WorkerGroup("core", "#").group_id == WorkerGroup("core", "#").group_id
    assert WorkerGroup("core", "#").group_id != WorkerGroup("edge", "#").group_id


def test_group_rejects_bad_pools_and_keys() -> None:
    with pytest.raises(InvalidNameError):
        WorkerGroup("bad-pool", "k")
    with pytest.raises(InvalidNameError):
        WorkerGroup("core", "\ud800")  # a lone surrogate is not UTF-8


def test_environment_is_the_worker_protocol() -> None:
    group = WorkerGroup("core", "a key")
    assert group.environment("w1") == {
        "WORKER_ID": "w1",
        "WORKER_KEY": "a key",
        "WORKER_POOL": "core",
        "WORKER_REQUESTS_QUEUE": protocol.request_queue("core", "a key"),
        "WORKER_ACTIVITY_EXCHANGE": protocol.activity_exchange("core"),
    }


@pytest.mark.parametrize(("backlog", "expected"), [(0, 1), (-3, 1), (1, 1), (10, 1), (11, 2), (35, 4),
                                                   (40, 4), (10_000, 4)])
def test_desired_workers_follows_queue_length(backlog: int, expected: int) -> None:
    assert desired_workers(backlog, min_workers=1, max_workers=4, target_backlog=10) == expected


def test_noop_driver_reports_what_it_was_told_and_does_nothing() -> None:
    told = WorkerGroup("core", "42")
    driver = NoopDriver([told, WorkerGroup("edge", "1")])
    driver.start(WorkerGroup("core", "7"))
    driver.stop(told)
    assert driver.list_running("core") == {"42"}
    assert driver.scale(told, backlog=1000) == 1
    assert NoopDriver().list_running("core") == set()


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SWITCHYARD_RPC_DRIVER", "SWITCHYARD_RPC_WORKER_COMMAND", "SWITCHYARD_RPC_WORKER_HANDLER",
                 "SWITCHYARD_RPC_MIN_WORKERS", "SWITCHYARD_RPC_MAX_WORKERS", "SWITCHYARD_RPC_TARGET_BACKLOG",
                 "SWITCHYARD_RPC_MIN_SPARES"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="SWITCHYARD_RPC_WORKER_HANDLER is not set") as refused:
        DriverSettings.from_env()  # no demo in production: a worker must be told what to run
    assert "\n" not in str(refused.value)
    default = DriverSettings.from_env(default_handler=DEMO_HANDLER)  # switchyard local's
    # The lean entry point, not the whole command line (issue 40: a second of a first call).
    assert default.command == (sys.executable, "-m", "switchyard.rpc.worker", "--handler", DEMO_HANDLER)
    assert (default.driver, default.min_workers, default.max_workers, default.target_backlog,
            default.min_spares) == ("subprocess", 1, 4, 10, 0)
    assert isinstance(driver_from_env(default), SubprocessDriver)

    monkeypatch.setenv("SWITCHYARD_RPC_WORKER_HANDLER", "tests.rpc.handlers:whoami")
    assert DriverSettings.from_env().command[-1] == "tests.rpc.handlers:whoami"
    monkeypatch.setenv("SWITCHYARD_RPC_WORKER_COMMAND", "my-worker --flag 'a b'")
    assert DriverSettings.from_env().command == ("my-worker", "--flag", "a b")
    monkeypatch.setenv("SWITCHYARD_RPC_DRIVER", "noop")
    assert isinstance(driver_from_env(), NoopDriver)
    monkeypatch.delenv("SWITCHYARD_RPC_WORKER_COMMAND")
    monkeypatch.delenv("SWITCHYARD_RPC_WORKER_HANDLER")
    assert DriverSettings.from_env().command == ()  # no handler needed where no worker is started
    monkeypatch.setenv("SWITCHYARD_RPC_DRIVER", "kubernetes")
    with pytest.raises(ConfigError, match="SWITCHYARD_RPC_DRIVER"):
        DriverSettings.from_env()


def test_subprocess_driver_rejects_bad_sizes() -> None:
    with pytest.raises(ConfigError):
        SubprocessDriver(COMMAND, min_workers=0)
    with pytest.raises(ConfigError):
        SubprocessDriver(COMMAND, min_workers=3, max_workers=2)


def test_start_failure_is_a_driver_error(tmp_path: Path) -> None:
    driver = SubprocessDriver([str(tmp_path / "no-such-binary")], log_dir=tmp_path)
    with pytest.raises(DriverError):
        driver.start(WorkerGroup("core", "k"))
    assert driver.list_running("core") == set()


def test_env_adds_to_the_runtime_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker gets what the runtime was started with (here the trace log ``switchyard demo`` turns
    on) as well as the driver's own variables and the worker protocol's; ``env`` used to replace it."""
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(tmp_path / "trace.jsonl"))
    driver = SubprocessDriver([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                              log_dir=tmp_path, env={"SLEEPY_SECONDS": "1"})
    monkeypatch.setenv("SET_AFTERWARDS", "1")  # the environment as it was when the driver was made
    group = WorkerGroup("core", "k")
    driver.start(group)
    wait_for(lambda: driver.list_running("core") == set(), timeout=10, what="the worker to exit")
    seen = json.loads((tmp_path / f"{group.group_id}.log").read_text())
    assert seen[tracing.TRACE_LOG_ENV] == str(tmp_path / "trace.jsonl") and seen["PATH"] == os.environ["PATH"]
    assert seen["SLEEPY_SECONDS"] == "1" and seen["WORKER_KEY"] == "k" and "SET_AFTERWARDS" not in seen


# -- subprocess driver, real workers ------------------------------------------------------------
@pytest.fixture
def driver(tmp_path: Path) -> Iterator[SubprocessDriver]:
    d = SubprocessDriver(COMMAND, min_workers=1, max_workers=4, target_backlog=10, log_dir=tmp_path,
                         stop_timeout=10, env=subprocess_env())
    yield d
    d.close()


def make_group(pool: str, settings: RpcSettings, key: str) -> WorkerGroup:
    with PoolTopology(pool, settings) as topology:
        topology.ensure_request_queue(key)
    return WorkerGroup(pool, key)


def consumers(settings: RpcSettings, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.consumer_count
    finally:
        connection.close()


def test_start_is_idempotent_and_the_worker_answers(pool, driver: SubprocessDriver, tmp_path: Path) -> None:
    name, settings = pool
    group = make_group(name, settings, "infra 42")
    driver.start(group)
    driver.start(group)
    assert driver.worker_count(group) == 1
    wait_for(lambda: consumers(settings, group.requests_queue) == 1, timeout=20, what="worker consuming")
    assert driver.list_running(name) == {"infra 42"}
    with RpcClient(name, settings) as client:
        response = client.call("infra 42", "hello", timeout=10)
    assert response.ok
    worker_id = driver.workers(group)[0].worker_id
    assert response.text() == f"key=infra 42 worker={worker_id} body=hello"
    assert (tmp_path / f"{group.group_id}.log").exists()
    assert consumers(settings, group.requests_queue) == 1  # still one worker after the second start


def test_stop_is_idempotent_and_the_worker_exits(pool, driver: SubprocessDriver) -> None:
    name, settings = pool
    group = make_group(name, settings, "#")
    driver.stop(group)  # never started: nothing to do
    driver.start(group)
    wait_for(lambda: consumers(settings, group.requests_queue) == 1, timeout=20, what="worker consuming")
    process = driver.workers(group)[0].process
    driver.stop(group)
    assert process.poll() == 0  # exited on SIGTERM, cleanly, within the grace period
    assert driver.list_running(name) == set()
    assert consumers(settings, group.requests_queue) == 0
    driver.stop(group)


def test_a_killed_worker_leaves_list_running(pool, driver: SubprocessDriver) -> None:
    name, settings = pool
    group = make_group(name, settings, "🚂")
    driver.start(group)
    assert driver.list_running(name) == {"🚂"}
    os.kill(driver.workers(group)[0].pid, signal.SIGKILL)
    wait_for(lambda: "🚂" not in driver.list_running(name), timeout=10, what="killed worker reaped")
    driver.start(group)  # what the control loop does next: the group comes back
    assert driver.list_running(name) == {"🚂"}


def test_scale_up_with_backlog_and_back_down_to_min(pool, driver: SubprocessDriver) -> None:
    name, settings = pool
    group = make_group(name, settings, "busy")
    driver.start(group)
    assert driver.scale(group, backlog=35) == 4
    assert driver.worker_count(group) == 4
    wait_for(lambda: consumers(settings, group.requests_queue) == 4, timeout=30, what="4 workers consuming")
    oldest = driver.workers(group)[0]
    assert driver.scale(group, backlog=0) == 1
    assert [w.worker_id for w in driver.workers(group)] == [oldest.worker_id]  # the newest were stopped
    wait_for(lambda: consumers(settings, group.requests_queue) == 1, timeout=10, what="back to 1 consumer")
    assert driver.scale(group, backlog=11) == 2
    assert driver.worker_count(group) == 2


@pytest.mark.parametrize(("code", "level"), [(INTENDED_CRASH_EXIT, logging.INFO), (70, logging.WARNING)])
def test_an_intended_crash_is_logged_at_info_any_other_exit_warns(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, code: int, level: int) -> None:
    """``examples.crash`` (the demo's and the alarm scenario's poison) exits as intended: no warning."""
    caplog.set_level(logging.INFO, logger=logger.name)
    driver = SubprocessDriver([sys.executable, "-c", f"import os; os._exit({code})"], log_dir=tmp_path)
    group = WorkerGroup("core", "k")
    driver.start(group)
    wait_for(lambda: driver.list_running("core") == set(), timeout=10, what="the worker to exit")
    [record] = [r for r in caplog.records if r.getMessage().startswith("worker exited")]
    assert (record.levelno, record.returncode) == (level, code)  # type: ignore[attr-defined]
    if level == logging.INFO:
        assert "intended crash" in record.getMessage()
