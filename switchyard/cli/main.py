"""The ``switchyard`` command line. Each area registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from switchyard import __version__
from switchyard.cli.options import add_stack_option, use_stack
from switchyard.core.errors import SwitchyardError

# Modules exposing ``register(subparsers)``; each adds its subcommands with a ``func`` default.
COMMAND_MODULES = (
    "switchyard.cli.rpc",
    "switchyard.cli.local",
    "switchyard.cli.delay",
    "switchyard.cli.pending",
    "switchyard.cli.bus",
    "switchyard.demo",
    "switchyard.cli.config",
    "switchyard.cli.alarms",
    "switchyard.cli.spark",
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
