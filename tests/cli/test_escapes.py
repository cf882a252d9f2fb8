"""Control characters from others (a caller's key or call id, a message id, a log field) never reach
a terminal raw: every human output escapes them (``\\x1b``, ``\\n``), JSON output encodes them."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from switchyard.core.config import Connections
from switchyard.delay.model import DelayedMessage
from switchyard.delay.store import PostgresDelayStore
from tests.conftest import subprocess_env, unique

FORGED = "\x1b[2J\x1b[H\nWARNING forged line"  # clears the screen, then prints a line of its own
ESCAPED = "\\x1b[2J\\x1b[H\\nWARNING forged line"


@pytest.fixture
def parked_schema() -> Iterator[str]:
    """A schema with one parked message whose id and reason are ``FORGED``."""
    schema = unique("escapes")
    store = PostgresDelayStore(Connections.from_env().postgres_dsn, schema)
    store.migrate()
    try:
        store.insert([DelayedMessage(FORGED, datetime.now(UTC) - timedelta(seconds=1), None, b"v", ())])
        node = "00000000-0000-0000-0000-000000000002"
        (ready,) = store.ready(node, timedelta(0), 10)
        assert store.park(node, [(ready, FORGED)]) == {FORGED}
        yield schema
    finally:
        store.drop_schema()
        store.close()


def test_delay_parked_prints_a_message_id_and_reason_escaped(parked_schema: str) -> None:
    def parked(*args: str) -> str:
        run = subprocess.run([sys.executable, "-m", "switchyard", "delay", "parked", *args],
                             env=subprocess_env(SWITCHYARD_DELAY_SCHEMA=parked_schema), capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout

    out = parked()
    assert "\x1b" not in out and len(out.splitlines()) == 4, out  # the message, its key and value
    assert out.splitlines()[1].startswith(f"  {ESCAPED}  deadline ") and out.splitlines()[1].endswith(ESCAPED)
    (row,) = json.loads(parked("--json"))
    assert (row["id"], row["reason"]) == (FORGED, FORGED)


def test_the_text_log_escapes_the_message_and_every_field() -> None:
    from switchyard.core import observability

    record = logging.LogRecord("switchyard", logging.WARNING, __file__, 1, "no worker for key %s", (FORGED,),
                               None)
    record.key, record.call_id = FORGED, "\x1b]0;title\x07"
    line = observability.TextFormatter(service="switchyard").format(record)
    assert line == (f"WARNING switchyard: no worker for key {ESCAPED} key=\"{ESCAPED}\" "
                    "call_id=\\x1b]0;title\\x07")
    try:
        raise ValueError(FORGED)
    except ValueError:
        record.exc_info = sys.exc_info()
    lines = observability.TextFormatter(service="switchyard").format(record).splitlines()
    assert "\x1b" not in "".join(lines) and lines[-1] == f"ValueError: {ESCAPED}"
    assert lines[1] == "Traceback (most recent call last):"  # the traceback keeps its own lines


def test_an_error_line_escapes_what_it_quotes(capsys: pytest.CaptureFixture[str]) -> None:
    from switchyard.cli.options import print_error

    assert print_error(f"no group for key {FORGED}") == 1
    # the line breaks folded (one line), the escape sequences shown
    err = capsys.readouterr().err
    assert err == "switchyard: error: no group for key \\x1b[2J\\x1b[H WARNING forged line\n"


def test_every_human_output_of_the_commands_goes_through_show() -> None:
    """``print`` in the command line and the demo prints JSON (safe by its encoding) or a blank line;
    every other line goes through ``switchyard.cli.options.show``, which escapes it."""
    import ast

    from tests.conftest import ROOT

    raw = []
    for path in sorted(p for part in ("cli", "demo") for p in (ROOT / "switchyard" / part).glob("*.py")):
        if path.name == "options.py":  # show and print_error themselves
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"\
                    and node.args and not _prints_json(node.args[0]):
                raw.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert raw == [], "print a person's lines with show(...): " + ", ".join(raw)


def _prints_json(arg: object) -> bool:
    import ast

    return isinstance(arg, ast.Call) and (
        (isinstance(arg.func, ast.Attribute) and arg.func.attr == "dumps")
        or (isinstance(arg.func, ast.Name) and arg.func.id == "openapi_document"))  # a JSON document
