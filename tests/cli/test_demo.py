"""``switchyard demo``'s steps print only their own lines: the handlers they run in its process are
called hundreds of times, and none of their metrics reaches stdout."""

from __future__ import annotations

import json
import subprocess

import pytest

from switchyard.cli.main import SHIP_ENV, metrics_routed
from switchyard.demo import Printer, delay_scheduler_part
from tests.conftest import subprocess_env


def emf_lines(text: str) -> list[str]:
    """The lines of ``text`` that are EMF documents (Powertools' metric blobs)."""
    found = []
    for line in text.splitlines():
        try:
            document = json.loads(line)
        except ValueError:
            continue
        if isinstance(document, dict) and "_aws" in document:
            found.append(line[:200])
    return found


def test_the_delay_step_prints_its_report_and_no_metrics(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """300 messages through the enqueue bridge, the fire loop and the scheduled-call relay (about a
    hundred relay invocations: Powertools printed its set at a metric's 100th value)."""
    monkeypatch.delenv(SHIP_ENV, raising=False)
    with metrics_routed():  # as `switchyard demo` runs: metrics off
        delay_scheduler_part(Printer())
    out = capsys.readouterr().out
    assert not emf_lines(out), emf_lines(out)
    assert "fired 300 of 300, 300 exactly once" in out, out


CLOSED = "127.0.0.1:1"  # nothing listens: a service the chosen parts must not need


def test_the_demo_of_the_redis_parts_needs_no_broker_postgres_or_kafka(python: str) -> None:
    """``--parts pending,bus``: only Redis runs for them; the other services' addresses lead nowhere
    and the demo shows its two parts, nothing of the others."""
    env = subprocess_env(SWITCHYARD_AMQP_URL=f"amqp://guest:guest@{CLOSED}/%2F",
                         SWITCHYARD_MANAGEMENT_URL=f"http://guest:guest@{CLOSED}",
                         SWITCHYARD_POSTGRES_DSN=f"postgresql://postgres@{CLOSED}/test",
                         SWITCHYARD_KAFKA_BOOTSTRAP=CLOSED)
    done = subprocess.run([python, "-m", "switchyard", "demo", "--parts", "pending,bus"], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Event bus (Routemaster's API)" in done.stdout and "Pending request queue" in done.stdout
    assert "Cold start" not in done.stdout and "Delay scheduler" not in done.stdout, done.stdout


@pytest.mark.parametrize(("parts", "says"), [("spark", "spark needs rpc and delay"),
                                             ("rpc,nosuch", "nosuch: the parts are rpc, delay")])
def test_a_choice_of_parts_the_demo_cannot_run_is_one_line(python: str, parts: str, says: str) -> None:
    done = subprocess.run([python, "-m", "switchyard", "demo", "--parts", parts], env=subprocess_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 3, done.stderr
