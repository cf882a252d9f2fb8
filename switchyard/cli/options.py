"""Options and set-up that every command shares: the parser, number flags, ``--stack``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import NoReturn, TextIO

from switchyard.core.deployed_config import CONFIG_PATH_ENV, config_path, deployed_values
from switchyard.core.observability import printable
from switchyard.core.reader import Setting
from switchyard.core.settings import AMQP_URL, KAFKA_BOOTSTRAP, MANAGEMENT_URL, POSTGRES_DSN, REDIS_URL
from switchyard.delay.parsing import parse_deadline


def fail(message: str) -> str:
    """The one line a failed command leaves on stderr (whitespace and line breaks folded, control
    characters escaped)."""
    return f"switchyard: error: {printable(' '.join(message.split()))}"


class CliParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line that says where to read on, not the usage
    block: ``switchyard: error: call: argument --timeout: ...; see switchyard call --help``."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("switchyard").strip()
        where = f"{command}: " if command else ""
        self.exit(2, fail(f"{where}{message}; see {self.prog} --help") + "\n")


class Number:
    """An argparse type: an ``int`` or ``float`` within bounds, with a message that names them.

    ``invalid_example`` is a value just out of range (the no-traceback test passes it)."""

    def __init__(self, cast: Callable[[str], float], minimum: float, *, above: bool = False,
                 maximum: float | None = None) -> None:
        self.cast, self.minimum, self.above, self.maximum = cast, minimum, above, maximum
        self.__name__ = "integer" if cast is int else "number"  # argparse: "invalid number value: 'x'"
        self.rule = (f"{'above' if above else 'at least'} {minimum:g}"
                     + (f" and at most {maximum:g}" if maximum is not None else ""))

    def __call__(self, text: str) -> float:
        value = self.cast(text)
        if not (value > self.minimum if self.above else value >= self.minimum) or \
                (self.maximum is not None and not value <= self.maximum):
            noun = "an integer" if self.cast is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {noun} {self.rule}, got {text!r}")
        return value

    @property
    def invalid_example(self) -> str:
        return f"{self.minimum:g}" if self.above else f"{self.minimum - 1:g}"


POSITIVE = Number(float, 0, above=True)  # seconds to wait, intervals
NON_NEGATIVE = Number(float, 0)  # delays that may be zero
COUNT = Number(int, 0)  # how many of something, none allowed
AT_LEAST_ONE = Number(int, 1)  # threads, concurrency, limits, milliseconds of a TTL
PORT = Number(int, 0, maximum=65535)  # 0: any free port


_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def at_time(text: str) -> datetime:
    """An argparse type: when a scheduled call runs. ``now``, ``+5s`` / ``+500ms`` / ``+2m`` / ``+1h`` /
    ``+1d`` from now, or an ISO-8601 date-time (no offset: UTC); a past one runs at once."""
    now = datetime.now(UTC)
    if text == "now":
        return now
    if text.startswith("+"):
        number = text[1:].rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[1 + len(number):] or "s"
        try:
            seconds = float(number) * _UNITS_S[unit]
        except (KeyError, ValueError):
            raise argparse.ArgumentTypeError(
                f"must be now, +N with a unit of ms, s, m, h or d, or an ISO-8601 date-time, got {text!r}"
            ) from None
        return now + timedelta(seconds=seconds)
    try:
        return parse_deadline(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or give now, or +N with a unit: +5s)") from None


def add_stack_option(parser: argparse.ArgumentParser) -> None:
    """``--stack NAME``: take the configuration a deployed stack wrote to SSM (after its deploy)."""
    parser.add_argument(
        "--stack", metavar="NAME", default=argparse.SUPPRESS,  # SUPPRESS: a subcommand's copy keeps the top's
        help="read the configuration of this deployed stack (SSM parameters and secrets at "
             "AWS_ENDPOINT_URL), as its Lambda functions do; e.g. SwitchyardLocal on LocalStack")


# The connection settings every command may take as a flag (as aws-cli's --endpoint-url, Celery's -b).
CONNECTION_FLAGS: tuple[tuple[tuple[str, ...], Setting[str]], ...] = (
    (("-b", "--broker-url"), AMQP_URL),
    (("--management-url",), MANAGEMENT_URL),
    (("--redis-url",), REDIS_URL),
    (("--postgres-dsn",), POSTGRES_DSN),
    (("--kafka-bootstrap",), KAFKA_BOOTSTRAP),  # HOST:PORT[,HOST:PORT]
)
# Short forms: every command's --pool is also -p, --key also -k.
SHORT_FLAGS = {"--pool": "-p", "--key": "-k"}


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """The connection flags, each instead of its variable (SUPPRESS: a subcommand's copy keeps the
    top's)."""
    group = parser.add_argument_group("connections (each flag instead of its variable)")
    for flags, setting in CONNECTION_FLAGS:
        shown = f"{setting.name} (default {setting.default})".replace("%", "%%")  # argparse %-formats help
        group.add_argument(*flags, dest=setting.name, metavar=flags[-1].rpartition("-")[2].upper(),
                           default=argparse.SUPPRESS, help=shown)


def use_connections(args: argparse.Namespace) -> None:
    """The connection flags given, as their variables: like ``--stack``, they hold for the whole
    process and the processes it starts (the local runtime's workers connect with them too)."""
    for _, setting in CONNECTION_FLAGS:
        if value := getattr(args, setting.name, None):
            os.environ[setting.name] = value


def add_short_flags(parser: argparse.ArgumentParser) -> None:
    """``SHORT_FLAGS`` on ``parser``'s options that have the long form (a taken short form is left)."""
    for action in parser._actions:
        for long, short in SHORT_FLAGS.items():
            if long in action.option_strings and short not in parser._option_string_actions:
                action.option_strings = [short, *action.option_strings]
                parser._option_string_actions[short] = action


def add_commands(parser: argparse.ArgumentParser, dest: str, *,
                 required: bool = False) -> argparse._SubParsersAction:
    """A group of subcommands, labelled ``COMMAND`` in every usage line."""
    return parser.add_subparsers(dest=dest, metavar="COMMAND", required=required,
                                 help="the command to run (each has its own --help)")


def add_json_option(parser: argparse.ArgumentParser, *, always: bool = False) -> None:
    """``--json``: the command's result as JSON on stdout (for scripts) instead of lines to read.
    ``always``: the result is JSON anyway (a handler's outcome, a message's ids); the flag is taken
    so that every command with output takes it."""
    parser.add_argument("--json", action="store_true",
                        help="print the result as JSON (it always is: the flag is accepted for scripts)"
                        if always else "print the result as JSON (for scripts) instead of lines to read")


def iso_time(epoch_s: float) -> str:
    """An epoch in seconds as ISO-8601 UTC to the second, as a person reads it."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def use_stack(stack: str) -> int:
    """Point the process at ``stack``'s configuration and read it now (a stack that is not deployed
    fails here); every setting is then read over it (``config_source``). Returns how many it holds."""
    os.environ[CONFIG_PATH_ENV] = config_path(stack)
    return len(deployed_values())


def show(*lines: str, file: TextIO | None = None, flush: bool = False) -> None:
    """Print ``lines`` for a person, each one line whatever it holds: control characters escaped
    (``printable``), so a caller's key, call id or message id can neither clear the screen nor forge
    a line. Every human output of the commands is printed here; ``--json`` output is safe by its
    encoding (``print(json.dumps(...))``), and ``tests/cli/test_escapes.py`` holds both to it.
    No lines, nothing printed."""
    if lines:
        print("\n".join(printable(line) for line in lines), file=file or sys.stdout, flush=flush)


def print_error(message: str) -> int:
    """Print ``message`` as the command's one error line; the exit code of a failure."""
    print(fail(message), file=sys.stderr)
    return 1
