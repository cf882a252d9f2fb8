"""One trace id followed from Spark rows through the delay scheduler, the orphan path, a worker
group's cold start and the worker's answer, on the real services, and printed by `switchyard trace`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from switchyard import cli
from switchyard.core import tracing
from switchyard.delay.parsing import format_deadline
from switchyard.local.delay_runtime import LocalRuntime
from switchyard.spark import rows as r
from switchyard.spark.job import PublishOptions, run
from tests.spark.test_publish import ECHO, wait_for_headers, write_jsonl

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


def test_one_trace_from_spark_rows_through_the_delay_the_orphan_path_a_cold_start_and_the_answer(
        spark, make_pool, planes, settings, connections, store, output, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "trace.jsonl"
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(log))  # before the driver copies the environment
    pool, rpc_settings = make_pool()
    planes.start(pool, rpc_settings, handler=ECHO)
    soon = datetime.now(UTC) + timedelta(seconds=3)
    rows = [{"key": "traced", "body": "called", "id": "call-1", "traceparent": TRACEPARENT},
            {"key": "traced", "body": "later", "id": "sched-1", "deadline": format_deadline(soon),
             "traceparent": TRACEPARENT}]
    local = LocalRuntime(settings, connections)
    local.start()
    try:
        summary = run(spark, PublishOptions(write_jsonl(tmp_path / "rows.jsonl", rows), str(tmp_path / "out"),
                                            pool=pool, timeout_s=30, output_format="json",
                                            delay_topic=settings.input_topic), report=lambda _line: None)
        fired = wait_for_headers(output, {"sched-1"}, timeout=20)
    finally:
        local.join()
    assert summary.counts == {(pool, "ok"): 1, (pool, "scheduled"): 1}

    # The delay scheduler relayed the row's trace on the fired record.
    relayed = tracing.parse(dict(fired["sched-1"].headers())[tracing.TRACEPARENT_HEADER])
    assert relayed is not None and relayed.trace_id == TRACE_ID

    hops = tracing.read_hops(TRACE_ID, str(log))
    by_event = {(hop["part"], hop["event"]): hop for hop in hops}
    assert {("rpc", "orphan forwarded"), ("rpc", "group started"), ("rpc", "handled")} <= set(by_event)
    # Stored, then fired at its deadline; or, on a machine slow enough that the job passed it, at once.
    delayed = [by_event.get(("delay", "stored")), by_event.get(("delay", "fired"))]
    if None in delayed:
        delayed = [by_event[("delay", "fired at once")]]
    assert [hop["id"] for hop in delayed] == ["sched-1"] * len(delayed), [h["event"] for h in hops]
    orphan, handled = by_event[("rpc", "orphan forwarded")], by_event[("rpc", "handled")]
    assert orphan["cold_start"] is True and orphan["key"] == "traced" and orphan["pool"] == pool
    assert handled["status"] == "ok" and handled["parent_id"] == orphan["span_id"]  # the worker's answer
    assert handled["process"] != orphan["process"]  # a worker process the cold start spawned
    assert hops.index(orphan) < hops.index(by_event[("rpc", "group started")]) < hops.index(handled)

    capsys.readouterr()
    assert cli.main(["trace", TRACEPARENT, "--log", str(log), "--json"]) == 0
    out = capsys.readouterr().out
    printed = json.loads(out.splitlines()[0])
    assert printed["trace_id"] == TRACE_ID and printed["hops"] == hops, out
    assert cli.main(["trace", TRACE_ID, "--log", str(log)]) == 0
    text = capsys.readouterr().out
    assert f"trace {TRACE_ID}: {len(hops)} hops" in text and "rpc: handled took" in text
    assert r.TRACEPARENT in r.INPUT_COLUMNS
