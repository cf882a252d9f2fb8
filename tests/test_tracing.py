"""The W3C traceparent rules, the logger's correlation id, the X-Ray join and the local trace log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from switchyard.core import observability, tracing

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_parses_and_its_child_keeps_the_trace() -> None:
    parent = tracing.parse(VALID)
    assert parent == tracing.TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")
    assert tracing.parse(VALID.encode()) == parent  # AMQP and Kafka headers are bytes
    assert parent.traceparent == VALID
    child = parent.child()
    assert child.trace_id == parent.trace_id and child.parent_id == parent.span_id
    assert child.span_id != parent.span_id and len(child.span_id) == 16
    assert tracing.parse(child.traceparent) == tracing.TraceContext(child.trace_id, child.span_id, "01")
    assert parent.xray_root == "1-4bf92f35-77b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize("value", [
    "", "garbage", VALID.upper(), VALID.replace("00-", "01-", 1), VALID.replace("00-", "ff-", 1),
    "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
    VALID + "-extra", VALID[:-1], " " + VALID, VALID + "\n", 42, None, b"\xff\xfe",
    "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
])
def test_a_malformed_traceparent_does_not_parse(value: object) -> None:
    assert tracing.parse(value) is None


def test_a_malformed_value_starts_a_new_trace_counted_and_shown_bounded(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "stats", tracing.TraceStats())
    hostile = "00-zz\x1b[31m" + "A" * 5000
    with caplog.at_level(logging.WARNING, logger=observability.logger.name):
        observability.logger.addHandler(caplog.handler)
        try:
            context = tracing.continue_from(hostile)
        finally:
            observability.logger.removeHandler(caplog.handler)
    assert tracing.parse(context.traceparent) is not None and context.parent_id is None
    assert tracing.stats.malformed == 1
    shown = [r.traceparent for r in caplog.records if hasattr(r, "traceparent")]
    assert shown and len(shown[0]) <= 64 * 4 + 3 and "\x1b" not in shown[0] and "A" * 100 not in shown[0]
    assert tracing.continue_from(None).parent_id is None and tracing.stats.malformed == 1  # absent: no count
    assert tracing.from_headers({"traceparent": VALID}).trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_new_traces_are_valid_and_distinct() -> None:
    ids = {tracing.new_trace().trace_id for _ in range(1000)}
    assert len(ids) == 1000
    assert all(tracing.parse(tracing.new_trace().traceparent) for _ in range(100))


def test_scope_sets_the_correlation_id_and_what_is_sent_on_continues_it() -> None:
    context = tracing.new_trace()
    assert tracing.current() is None
    assert tracing.outgoing().trace_id != context.trace_id  # no request in hand: a new trace
    with tracing.scope(context):
        assert observability.logger.thread_safe_get_current_keys()["correlation_id"] == context.trace_id
        sent = tracing.outgoing()
        assert sent.trace_id == context.trace_id and sent.parent_id == context.span_id
    assert "correlation_id" not in observability.logger.thread_safe_get_current_keys()
    assert tracing.current() is None


def test_a_lambda_invocation_annotates_the_traces_it_worked_on(monkeypatch: pytest.MonkeyPatch) -> None:
    notes: list[tuple[str, object]] = []
    monkeypatch.setattr(observability.tracer, "put_annotation", lambda k, v: notes.append((k, v)))
    monkeypatch.setattr(observability.tracer, "put_metadata", lambda k, v: notes.append((k, v)))
    first, second = tracing.new_trace(), tracing.new_trace()

    def work(_event: object, _context: object) -> str:
        for context in (first, second, second):  # as the messages of a batch come in
            tracing.continue_from(context.traceparent)
        return "done"

    assert observability.joins_traces(work)({}, None) == "done"
    assert notes == [("trace_id", first.trace_id),
                     ("traces", {first.trace_id: first.xray_root, second.trace_id: second.xray_root})]
    notes.clear()
    tracing.continue_from(first.traceparent)  # outside an invocation: nothing is collected
    assert observability.joins_traces(lambda e, c: None)({}, None) is None and notes == []


def test_hops_are_written_read_back_in_order_and_rotated(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "logs" / "trace.jsonl"
    monkeypatch.delenv(tracing.TRACE_LOG_ENV, raising=False)
    context = tracing.new_trace()
    tracing.hop(context, "rpc", "publish")  # off: nothing written
    assert not path.exists()
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(path))
    monkeypatch.setenv(tracing.TRACE_LOG_MAX_BYTES_ENV, "4096")
    child = context.child()
    tracing.hop(context, "rpc", "publish", key="k")
    tracing.hop(child, "rpc", "handled", duration_ms=1.23456, key="k")
    tracing.hop(tracing.new_trace(), "rpc", "publish")  # another trace
    hops = tracing.read_hops(context.trace_id, str(path))
    assert [(h["event"], h["span_id"], h["parent_id"]) for h in hops] == [
        ("publish", context.span_id, None), ("handled", child.span_id, context.span_id)]
    assert hops[1]["duration_ms"] == 1.235 and hops[0]["part"] == "rpc" and hops[0]["key"] == "k"
    while not (tmp_path / "logs" / "trace.jsonl.1").exists():  # past 4 KiB: it moves to .1, a new one starts
        tracing.hop(tracing.new_trace(), "rpc", "publish")
    tracing.hop(tracing.new_trace(), "rpc", "publish")
    assert (tmp_path / "logs" / "trace.jsonl.1").exists() and path.stat().st_size < 4096
    assert len(tracing.read_hops(context.trace_id, str(path))) == 2  # read from the older file too
    with path.open("a") as log:
        log.write('{"trace_id": "' + context.trace_id + '", cut by a crash\n')
    assert len(tracing.read_hops(context.trace_id, str(path))) == 2
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "f")  # a function never writes files
    assert tracing.trace_log_path() is None


def test_enable_trace_log_defaults_and_respects_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv(tracing.TRACE_LOG_ENV, raising=False)
    assert tracing.enable_trace_log() == tracing.DEFAULT_TRACE_LOG
    assert os.environ[tracing.TRACE_LOG_ENV] == tracing.DEFAULT_TRACE_LOG  # the workers it starts inherit it
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, "off")
    assert tracing.enable_trace_log() is None
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, "/tmp/x.jsonl")
    assert tracing.enable_trace_log() == "/tmp/x.jsonl"
    assert json.dumps(tracing.read_hops("f" * 32, "/nonexistent/trace.jsonl")) == "[]"


def test_a_log_another_process_rotated_is_reopened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(path))
    context = tracing.new_trace()
    tracing.hop(context, "rpc", "publish")
    path.rename(tmp_path / "trace.jsonl.1")  # what another process's rotation does
    monkeypatch.setattr(tracing._trace_log, "_checked", 0.0)  # its once-a-second check is due
    tracing.hop(context.child(), "rpc", "handled")
    assert path.exists() and [h["event"] for h in tracing.read_hops(context.trace_id, str(path))] == [
        "publish", "handled"]


def test_a_flood_of_malformed_values_logs_a_few_lines(caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "stats", tracing.TraceStats())
    observability.logger.addHandler(caplog.handler)
    try:
        for _ in range(1000):
            tracing.continue_from("bad")
    finally:
        observability.logger.removeHandler(caplog.handler)
    assert tracing.stats.malformed == 1000
    warned = {id(r) for r in caplog.records if "malformed traceparent" in r.getMessage()}
    assert len(warned) == 10  # the 1st, 2nd, 4th, ... 512th


def test_scope_if_is_a_scope_or_nothing() -> None:
    context = tracing.new_trace()
    with tracing.scope_if(context) as entered:
        assert entered is context and tracing.current() is context
    with tracing.scope_if(None) as entered:
        assert entered is None and tracing.current() is None
