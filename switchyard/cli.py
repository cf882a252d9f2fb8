"""The ``switchyard`` command line. Each area registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from switchyard import __version__
from switchyard.deployed_config import CONFIG_PATH_ENV, config_path, load_deployed_config
from switchyard.errors import SwitchyardError

# Modules exposing ``register(subparsers)``; each adds its subcommands with a ``func`` default.
COMMAND_MODULES = (
    "switchyard.rpc.cli",
    "switchyard.local.cli",
    "switchyard.delay.cli",
    "switchyard.pending.cli",
    "switchyard.bus.cli",
    "switchyard.demo",
    "switchyard.config_cli",
    "switchyard.local.alarm_scenario",
    "switchyard.spark.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchyard",
        description="Route work to the right worker, at the right time, without losing it.",
        epilog="Configuration comes from SWITCHYARD_* environment variables; see the README.",
    )
    parser.add_argument("--version", action="version", version=f"switchyard {__version__}")
    add_stack_option(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def add_stack_option(parser: argparse.ArgumentParser) -> None:
    """``--stack NAME``: take the configuration a deployed stack wrote to SSM (after its deploy)."""
    parser.add_argument(
        "--stack", metavar="NAME", default=argparse.SUPPRESS,  # SUPPRESS: a subcommand's copy keeps the top's
        help="read the configuration of this deployed stack (SSM parameters and secrets at "
             "AWS_ENDPOINT_URL), as its Lambda functions do; e.g. SwitchyardLocal on LocalStack")


def use_stack(stack: str) -> int:
    """Point the process at ``stack``'s configuration and load it now, so every setting sees it."""
    os.environ[CONFIG_PATH_ENV] = config_path(stack)
    return load_deployed_config()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        if getattr(args, "stack", None):
            use_stack(args.stack)
        return int(func(args) or 0)
    except SwitchyardError as exc:
        print(f"switchyard: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
