"""`switchyard trace ID` and the demo's "Following one request", on a trace log written by hops."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from switchyard import cli
from switchyard.core import tracing
from switchyard.demo import Printer, follow_one_request


def write_trace(path: Path, monkeypatch: pytest.MonkeyPatch) -> tracing.TraceContext:
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(path))
    warm, cold = tracing.new_trace(), tracing.new_trace()
    tracing.hop(warm, "rpc", "orphan forwarded", pool="p", key="k", cold_start=False)
    tracing.hop(cold, "rpc", "publish", key="k")
    tracing.hop(cold.child(), "rpc", "orphan forwarded", pool="p", key="k", cold_start=True)
    tracing.hop(cold.child(), "rpc", "handled", duration_ms=0.5, key="k", status="ok")
    return cold


def test_trace_prints_the_hops_in_order_or_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cold = write_trace(tmp_path / "trace.jsonl", monkeypatch)
    assert cli.main(["trace", cold.trace_id]) == 0  # the log SWITCHYARD_TRACE_LOG names
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"trace {cold.trace_id}: 3 hops from {tmp_path / 'trace.jsonl'}"
    assert "rpc: publish" in lines[1] and "cold_start=True" in lines[2] and "took 0.5 ms" in lines[3]
    assert cli.main(["trace", cold.traceparent, "--json"]) == 0  # a whole traceparent names its trace
    printed = json.loads(capsys.readouterr().out)
    assert [h["event"] for h in printed["hops"]] == ["publish", "orphan forwarded", "handled"]
    assert cli.main(["trace", tracing.new_trace().trace_id]) == 1  # not in the log: one error line
    assert capsys.readouterr().err.startswith("switchyard: error: no hop of trace ")


def test_the_demo_follows_the_first_request_that_started_a_group_of_its_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The trace log outlives runs: after the tests, a second demo followed a test pool's cold start
    (the first in the log), not its own."""
    log = tmp_path / "trace.jsonl"
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(log))
    earlier = tracing.new_trace()
    tracing.hop(earlier, "rpc", "orphan forwarded", pool="faults_1", key="k", cold_start=True)
    with log.open("a") as lines:  # skipped: no trace id, not an object
        lines.write('{"cold_start":true, "no trace id": 1}\n[1, "cold_start":true]\n')
    cold = write_trace(log, monkeypatch)
    follow_one_request(Printer(), str(log), "p")
    out = capsys.readouterr().out
    assert f"switchyard trace {cold.trace_id}" in out and out.count(" rpc: ") == 3
    follow_one_request(Printer(), str(log), "faults_1")
    assert f"switchyard trace {earlier.trace_id}" in capsys.readouterr().out
    follow_one_request(Printer(), str(log), "none_of_these")
    assert not re.search("switchyard trace [0-9a-f]{32}", capsys.readouterr().out)


FORGED = "\x1b[2J\x1b[H\nWARNING forged line"  # clears the screen, then prints a line of its own


def test_trace_prints_a_callers_key_and_call_id_with_control_characters_escaped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A caller's key and call id reached the terminal raw: ESC sequences and newlines."""
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(tmp_path / "trace.jsonl"))
    context = tracing.new_trace()
    tracing.hop(context, "rpc", "published", pool="p", key=FORGED, id=FORGED, reason=FORGED)
    assert cli.main(["trace", context.trace_id]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and len(out.splitlines()) == 2, out
    assert "key=\\x1b[2J\\x1b[H\\nWARNING forged line" in out
    assert cli.main(["trace", context.trace_id, "--json"]) == 0  # JSON: the key as it is
    assert json.loads(capsys.readouterr().out)["hops"][0]["key"] == FORGED
