"""One convention for every command: each flag and positional explained, one label for subcommand
groups, ``--stack`` everywhere, and stdout kept for results (no metric blob, a line on start)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from switchyard.cli import build_parser
from switchyard.cli.main import commands
from switchyard.core.config import Connections
from switchyard.delay.store import PostgresDelayStore
from tests.conftest import ROOT, subprocess_env, unique


def _parsers(parser: argparse.ArgumentParser, name: str = "switchyard"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from _parsers(child, f"{name} {sub}")


def test_every_flag_and_positional_has_help() -> None:
    missing = [f"{name}: {action.option_strings or action.dest}"
               for name, parser in _parsers(build_parser()) for action in parser._actions
               if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()]
    assert not missing, "without help text: " + "; ".join(missing)


def test_subcommand_groups_share_one_label_and_every_command_takes_stack() -> None:
    labels = {action.metavar for _, parser in _parsers(build_parser()) for action in parser._actions
              if isinstance(action, argparse._SubParsersAction)}
    assert labels == {"COMMAND"}
    without = [c.prog for c in commands(build_parser())
               if not any("--stack" in a.option_strings for a in c._actions)]
    assert not without, f"no --stack: {without}"


def _no_metric_blob(text: str) -> None:
    assert "_aws" not in text and "CloudWatchMetrics" not in text, text[:500]
    for line in text.splitlines():
        if line.startswith("{"):
            assert "_aws" not in json.loads(line)


def test_a_failed_pending_call_prints_no_metrics() -> None:
    env = subprocess_env()
    env.pop("SWITCHYARD_SHIP_METRICS", None)
    done = subprocess.run([sys.executable, "-m", "switchyard", "pending", "call",
                           "--endpoint", unique("nobody"), "--pickup-timeout", "0.5"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    _no_metric_blob(done.stderr)
    assert done.stderr.count("\n") == 1 and "pickup timeout" in done.stderr


def test_delay_run_says_it_started_and_prints_no_metrics() -> None:
    schema = unique("conv")
    env = subprocess_env(SWITCHYARD_DELAY_SCHEMA=schema, SWITCHYARD_DELAY_INPUT_TOPIC=f"{schema}-in",
                         SWITCHYARD_DELAY_OUTPUT_TOPIC=f"{schema}-out")
    env.pop("SWITCHYARD_SHIP_METRICS", None)
    proc = subprocess.Popen([sys.executable, "-m", "switchyard", "delay", "run"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    guard = threading.Timer(90, proc.kill)  # a start that never comes fails the test, not the run
    guard.start()
    try:
        first = proc.stderr.readline()  # the line a person reads, once the loops run
        time.sleep(3)  # window: a few loop passes; none prints its metric blob (each used to)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        guard.cancel()
        with PostgresDelayStore(Connections.from_env().postgres_dsn, schema) as dropping:
            dropping.drop_schema()
    assert first.startswith("switchyard delay: running enqueue, fire, sweep, scheduled: "), first + err
    assert proc.returncode == 0, err
    _no_metric_blob(out)
    _no_metric_blob(first + err)


def test_log_lines_are_text_locally_and_json_on_aws_or_when_asked(monkeypatch) -> None:
    import logging

    from switchyard.core import observability

    for variable in (observability.LOG_FORMAT_ENV, "AWS_LAMBDA_FUNCTION_NAME",
                     "ECS_CONTAINER_METADATA_URI_V4"):
        monkeypatch.delenv(variable, raising=False)
    assert observability.log_format() == "text"
    monkeypatch.setenv("ECS_CONTAINER_METADATA_URI_V4", "http://169.254.170.2/v4/x")
    assert observability.log_format() == "json"
    monkeypatch.setenv(observability.LOG_FORMAT_ENV, "text")
    assert observability.log_format() == "text"
    monkeypatch.delenv("ECS_CONTAINER_METADATA_URI_V4")
    monkeypatch.setenv(observability.LOG_FORMAT_ENV, "JSON")
    assert observability.log_format() == "json"

    record = logging.LogRecord("switchyard", logging.WARNING, __file__, 1, "worker exited", None, None)
    record.pool, record.reason = "core", "exit code 1"
    assert observability.TextFormatter(service="switchyard").format(record) == \
        'WARNING switchyard: worker exited pool=core reason="exit code 1"'


def test_worker_flags_win_over_their_variables(monkeypatch) -> None:
    from switchyard.cli import main
    from switchyard.cli import rpc as rpc_cli
    from switchyard.rpc.worker import WorkerConfig

    seen = {}

    def fake_run_worker(handler: str, env: dict[str, str], announce=None):
        seen["config"] = WorkerConfig.from_env(env=env)
        return type("Stats", (), {"handled": 0, "errors": 0, "requeued": 0})()

    monkeypatch.setattr(rpc_cli, "run_worker", fake_run_worker)
    variables = {"WORKER_POOL": "from_env", "WORKER_KEY": "env-key", "WORKER_ID": "env-id",
                 "WORKER_REQUESTS_QUEUE": "", "WORKER_ACTIVITY_EXCHANGE": "env-activity"}
    for variable, value in variables.items():
        monkeypatch.setenv(variable, value)
    assert main(["worker", "--handler", "switchyard.rpc.examples:echo", "--pool", "from_flag",
                 "--activity-exchange", "x-activity"]) == 0
    config = seen["config"]
    assert (config.pool, config.key, config.worker_id) == ("from_flag", "env-key", "env-id")
    assert config.activity_exchange == "x-activity"
    assert config.requests_queue.startswith("from_flag-req-")
    # the flags are passed on as values: the process environment is left as it was
    assert {v: os.environ[v] for v in variables} == variables


def test_a_worker_prints_one_start_line_and_reads_the_documented_names(monkeypatch, capsys) -> None:
    """``SWITCHYARD_RPC_POOL``/``SWITCHYARD_RPC_KEY`` (documented) stand for the drivers' ``WORKER_*``;
    the start line names pool, key, handler and broker, the broker's password masked."""
    from switchyard.cli import main
    from switchyard.cli import rpc as rpc_cli
    from switchyard.rpc.settings import RpcSettings
    from switchyard.rpc.worker import WorkerConfig

    def fake_run_worker(handler: str, env: dict[str, str], announce=None):
        settings = RpcSettings.from_env()
        announce(WorkerConfig.from_env(settings, env), settings)
        return type("Stats", (), {"handled": 0, "errors": 0, "requeued": 0})()

    monkeypatch.setattr(rpc_cli, "run_worker", fake_run_worker)
    for variable in ("WORKER_POOL", "WORKER_KEY", "WORKER_ID"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("SWITCHYARD_RPC_POOL", "documented")
    monkeypatch.setenv("SWITCHYARD_RPC_KEY", "infra=42")
    monkeypatch.setenv("SWITCHYARD_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")  # the flag wins
    assert main(["worker", "--handler", "switchyard.rpc.examples:echo", "--id", "w1",
                 "-b", "amqp://alice:s3cret@127.0.0.1:5672/%2F"]) == 0
    start, stopped = capsys.readouterr().err.splitlines()
    assert start == ("switchyard worker w1: pool 'documented', key 'infra=42', handler "
                     "switchyard.rpc.examples:echo, broker amqp://alice:***@127.0.0.1:5672/%2F; "
                     "SIGTERM or Ctrl-C to stop"), start
    assert stopped.startswith("worker stopped: 0 handled")
    assert main(["worker", "--handler", "switchyard.rpc.examples:echo", "-p", "flag", "-k", "k2"]) == 0
    assert "pool 'flag', key 'k2'" in capsys.readouterr().err


def test_the_empty_key_is_a_key(monkeypatch) -> None:
    """The protocol allows the empty key: a worker for it starts (only an absent key is missing)."""
    from switchyard.cli import main
    from switchyard.cli import rpc as rpc_cli
    from switchyard.rpc.worker import WorkerConfig

    seen = {}

    def fake_run_worker(handler: str, env: dict[str, str], announce=None):
        seen["config"] = WorkerConfig.from_env(env=env)
        return type("Stats", (), {"handled": 0, "errors": 0, "requeued": 0})()

    monkeypatch.setattr(rpc_cli, "run_worker", fake_run_worker)
    monkeypatch.setenv("WORKER_POOL", "p")
    monkeypatch.setenv("WORKER_KEY", "")
    assert main(["worker", "--handler", "switchyard.rpc.examples:echo"]) == 0
    assert seen["config"].key == ""
    seen.clear()
    monkeypatch.delenv("WORKER_KEY")
    assert main(["worker", "--handler", "switchyard.rpc.examples:echo"]) != 0
    assert not seen, "no worker starts without a key"


def test_metrics_are_off_for_a_command_and_the_setting_is_restored(monkeypatch) -> None:
    from switchyard.cli.main import METRICS_DISABLED_ENV, metrics_routed

    monkeypatch.delenv("SWITCHYARD_SHIP_METRICS", raising=False)
    monkeypatch.delenv(METRICS_DISABLED_ENV, raising=False)
    with metrics_routed():
        assert os.environ[METRICS_DISABLED_ENV] == "true"
    assert METRICS_DISABLED_ENV not in os.environ


def test_a_command_that_ships_its_own_metrics_keeps_them_on(monkeypatch) -> None:
    """``alarms scenario`` installs the shipper itself: its metrics are what trips the alarms."""
    from switchyard.cli.main import METRICS_DISABLED_ENV, metrics_routed

    monkeypatch.delenv("SWITCHYARD_SHIP_METRICS", raising=False)
    monkeypatch.delenv(METRICS_DISABLED_ENV, raising=False)
    with metrics_routed(ships_its_own=True):
        assert METRICS_DISABLED_ENV not in os.environ
    args = build_parser().parse_args(["alarms", "scenario"])
    assert args.ships_metrics is True
    assert not getattr(build_parser().parse_args(["config"]), "ships_metrics", False)


def test_metrics_that_are_off_stay_off_however_often_a_handler_runs(monkeypatch, capsys) -> None:
    """The local runtime and the demo run their handlers hundreds of times in one process; Powertools'
    switch skipped each flush's print but kept the set, and printed it at a metric's 100th value."""
    from dataclasses import dataclass

    from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent

    from switchyard.cli.main import METRICS_DISABLED_ENV
    from switchyard.core import observability
    from switchyard.local.lambda_context import FakeLambdaContext

    @dataclass
    class Outcome:
        handled: int

    handler = observability.lambda_handler_for(lambda _e, _c: Outcome(handled=1), data_class=EventBridgeEvent,
                                               metric_prefix="Quiet")
    monkeypatch.setenv(METRICS_DISABLED_ENV, "true")
    for _ in range(150):
        assert handler({"detail": {}}, FakeLambdaContext("quiet", 1000)) == {"handled": 1}
    _no_metric_blob(capsys.readouterr().out)
    monkeypatch.setenv(METRICS_DISABLED_ENV, "false")  # on again: printed, nothing kept from before
    handler({"detail": {}}, FakeLambdaContext("quiet", 1000))
    [blob] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert blob["QuietHandled"] == [1.0]


def test_commands_with_a_result_take_json() -> None:
    takes = {c.prog.removeprefix("switchyard ") for c in commands(build_parser())
             if any("--json" in a.option_strings for a in c._actions)}
    assert {"pool init", "pool bind", "pool delete", "pool status", "call", "delay migrate", "delay invoke",
            "delay send", "delay status", "delay parked", "delay replay", "pending call", "pending status",
            "bus status",
            "config", "alarms show"} <= takes
