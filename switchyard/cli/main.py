"""The ``switchyard`` command line. Each area registers its own subcommands."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence

from switchyard import __version__
from switchyard.cli.options import (
    CliParser,
    add_commands,
    add_connection_options,
    add_short_flags,
    add_stack_option,
    print_error,
    use_connections,
    use_stack,
)
from switchyard.cli.preflight import unavailable
from switchyard.core.docs import docs_link
from switchyard.core.errors import SwitchyardError
from switchyard.core.observability import redact_url
from switchyard.core.settings import SHIP_METRICS, TRACEBACK

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
    "switchyard.cli.status",
    "switchyard.cli.trace",
    "switchyard.cli.completion",
    "switchyard.cli.cost",
)
# Set to see the traceback of an unexpected error (a bug to report) instead of its one line.
TRACEBACK_ENV = TRACEBACK.name
METRICS_DISABLED_ENV = "POWERTOOLS_METRICS_DISABLED"
SHIP_ENV = SHIP_METRICS.name  # the metrics shipper's switch (switchyard.local.metrics_shipper)


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="switchyard",
        description="Route work to the right worker, at the right time, without losing it.",
        epilog="Configuration comes from SWITCHYARD_* environment variables (switchyard config shows them; "
               f"each is described at {docs_link('configuration.md')}). "
               f"An error is one line on stderr; exit 2 for usage, 1 for failures ({TRACEBACK_ENV}=1 "
               "shows an unexpected error's traceback).",
    )
    parser.add_argument("--version", action="version", version=f"switchyard {__version__}")
    add_stack_option(parser)
    subparsers = add_commands(parser, "command")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    add_connection_options(parser)
    for command in commands(parser):  # every command reads settings a deployed stack may hold
        if not any("--stack" in action.option_strings for action in command._actions):
            add_stack_option(command)
        add_connection_options(command)
        add_short_flags(command)
    return parser


def commands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser under ``parser`` that runs something (the leaves of the subcommand tree)."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        return [parser]
    return [leaf for child in dict.fromkeys(groups[0].choices.values()) for leaf in commands(child)]


@contextlib.contextmanager
def metrics_routed(ships_its_own: bool = False) -> Iterator[None]:
    """Stdout is for the command's result: metrics go to CloudWatch with ``SWITCHYARD_SHIP_METRICS=1``
    (the metrics shipper; a command that runs handlers re-installs it with their ``service``),
    otherwise nowhere (Powertools' ``POWERTOOLS_METRICS_DISABLED``, restored afterwards).
    ``ships_its_own``: the command installs the shipper itself (``alarms scenario``: its metrics
    are the point), so they are left on."""
    if os.environ.get("AWS_LAMBDA_FUNCTION_NAME") or ships_its_own:
        yield
        return
    if SHIP_METRICS.read(os.environ):  # Powertools is imported only where it may be used
        from switchyard.local.metrics_shipper import install_metrics_shipper, ship_metrics_enabled

        if ship_metrics_enabled():
            install_metrics_shipper()
            yield
            return
    before = os.environ.get(METRICS_DISABLED_ENV)
    os.environ[METRICS_DISABLED_ENV] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(METRICS_DISABLED_ENV, None)
        else:
            os.environ[METRICS_DISABLED_ENV] = before


def innermost(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub)command parser ``argv`` names, so a usage error points at that command's help."""
    for word in argv:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subparsers and word in subparsers[0].choices:
            parser = subparsers[0].choices[word]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extras = parser.parse_known_args(argv)
    if extras:  # as parse_args would, but from the command they were given to
        innermost(parser, argv).error(f"unrecognized arguments: {' '.join(extras)}")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    # Library warnings (Powertools' "no metrics to publish") are not the user's to act on.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"aws_lambda_powertools\.")
    try:
        use_connections(args)
        if getattr(args, "stack", None):
            use_stack(args.stack)
        with metrics_routed(getattr(args, "ships_metrics", False)):
            return int(func(args) or 0)
    except SwitchyardError as exc:
        return print_error(redact_url(str(exc)))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the last guard: a driver's error as one line, never a traceback
        if TRACEBACK.read(os.environ):
            raise
        return print_error(redact_url(unavailable(exc) or f"{type(exc).__name__}: {exc} (unexpected; rerun "
                                      f"with {TRACEBACK_ENV}=1 to see where, and report it)"))
