"""One convention for every command: each flag and positional explained, one label for subcommand
groups, ``--stack`` everywhere, and stdout kept for results (no metric blob, a line on start)."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
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
    try:
        time.sleep(4)  # a few loop passes: each used to print its metric blob
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        PostgresDelayStore(Connections.from_env().postgres_dsn, schema).drop_schema()
    assert proc.returncode == 0, err
    _no_metric_blob(out)
    _no_metric_blob(err)
    assert err.splitlines()[0].startswith("switchyard delay: running enqueue, fire, sweep: "), err
