"""One trace id followed from a Spark row through the delay scheduler, the scheduled-call relay into
the pool, the orphan path, a worker group's cold start and the worker's answer in a durable reply
queue, on the real services, and printed by `switchyard trace`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from switchyard import cli
from switchyard.core import tracing
from switchyard.delay.parsing import format_deadline
from switchyard.local.delay_runtime import LocalRuntime
from switchyard.rpc.client import RpcClient
from switchyard.spark.job import PublishOptions, run
from tests.conftest import unique
from tests.spark.test_publish import ECHO, delete_reply_queue, write_jsonl

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


def test_one_trace_from_a_spark_row_through_the_delay_the_orphan_path_a_cold_start_and_the_answer(
        spark, make_pool, planes, settings, connections, store, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "trace.jsonl"
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(log))  # before the driver copies the environment
    pool, rpc_settings = make_pool()
    planes.start(pool, rpc_settings, handler=ECHO)
    reply = unique("r")
    soon = datetime.now(UTC) + timedelta(seconds=3)
    rows = [{"key": "traced", "body": "later", "id": "sched-1", "deadline": format_deadline(soon),
             "traceparent": TRACEPARENT}]
    local = LocalRuntime(settings, connections)  # the scheduler and the relay into the pool
    local.start()
    try:
        summary = run(spark, PublishOptions(write_jsonl(tmp_path / "rows.jsonl", rows), str(tmp_path / "out"),
                                            pool=pool, timeout_s=30, output_format="json", reply_queue=reply,
                                            delay_topic=settings.input_topic), report=lambda _line: None)
        with RpcClient(pool, rpc_settings) as client:
            answers = client.collect(reply, ["sched-1"], timeout=60)
    finally:
        local.join()
        delete_reply_queue(rpc_settings, reply)
    assert summary.counts == {(pool, "scheduled"): 1}
    answer = answers["sched-1"]
    assert answer.status == "ok" and answer.body == b"later"
    answered = tracing.parse(answer.headers[tracing.TRACEPARENT_HEADER])  # the worker's answer, in the trace
    assert answered is not None and answered.trace_id == TRACE_ID

    hops = tracing.read_hops(TRACE_ID, str(log))
    by_event = {(hop["part"], hop["event"]): hop for hop in hops}
    # Stored, then fired at its deadline; or, on a machine slow enough that the job passed it, at once.
    delayed = [by_event.get(("delay", "stored")), by_event.get(("delay", "fired"))]
    if None in delayed:
        delayed = [by_event[("delay", "fired at once")]]
    chain = [*delayed, by_event[("rpc", "scheduled call published")], by_event[("rpc", "orphan forwarded")],
             by_event[("rpc", "group started")], by_event[("rpc", "handled")]]
    assert [hops.index(hop) for hop in chain] == sorted(hops.index(hop) for hop in chain), hops
    assert {hop.get("id") for hop in chain[:-3]} == {"sched-1"}
    orphan, handled = by_event[("rpc", "orphan forwarded")], by_event[("rpc", "handled")]
    assert orphan["cold_start"] is True and orphan["key"] == "traced" and orphan["pool"] == pool
    assert handled["status"] == "ok" and handled["parent_id"] == orphan["span_id"]
    assert answered.span_id == handled["span_id"]  # the answer is the worker's span
    assert handled["process"] != orphan["process"]  # a worker process the cold start spawned

    capsys.readouterr()
    assert cli.main(["trace", TRACEPARENT, "--log", str(log), "--json"]) == 0
    out = capsys.readouterr().out
    printed = json.loads(out.splitlines()[0])
    assert printed["trace_id"] == TRACE_ID and printed["hops"] == hops, out
    assert cli.main(["trace", TRACE_ID, "--log", str(log)]) == 0
    text = capsys.readouterr().out
    assert f"trace {TRACE_ID}: {len(hops)} hops" in text and "rpc: scheduled call published" in text
