"""One trace through the RPC hops: the client sets it, the worker runs under it (its logger's
correlation id) and answers with it, a shed copy keeps it; on the real RabbitMQ, real workers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from switchyard.core import tracing
from switchyard.demo import Printer, follow_one_request
from switchyard.demo.rpc_pool import demo_driver
from switchyard.rpc import protocol
from switchyard.rpc.client import RpcClient
from tests.rpc.test_rpc import bind

H = "tests.rpc.handlers"
GIVEN = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_call_carries_its_trace_to_the_worker_and_back(make_pool, workers, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "trace.jsonl"
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(log))
    name, settings = make_pool(delivery_limit=50)
    bind(name, settings, "k")
    workers.start(name, "k", f"{H}:traced", SHED_TIMES="2", **{tracing.TRACE_LOG_ENV: str(log)})
    workers.wait_consuming(settings, protocol.request_queue(name, "k"))
    with RpcClient(name, settings, timeout=15) as client:
        generated = client.call("k", "x")
        given = client.call("k", "x", headers={tracing.TRACEPARENT_HEADER: GIVEN,
                                               tracing.TRACESTATE_HEADER: "vendor=opaque"})
        malformed = client.call("k", "x", headers={tracing.TRACEPARENT_HEADER: "00-nonsense\x1b"})
        with tracing.scope(tracing.parse(GIVEN)):  # a call made while handling a request continues it
            nested = client.call("k", "x")

    seen = json.loads(generated.body)  # shed twice (Requeue), the copy kept the client's traceparent
    sent = tracing.parse(seen["traceparent"])
    answered = tracing.parse(generated.headers[tracing.TRACEPARENT_HEADER])
    assert sent and answered and answered.trace_id == sent.trace_id == seen["correlation_id"]
    assert answered.span_id != sent.span_id  # the worker's own span

    assert json.loads(given.body)["traceparent"] == GIVEN
    assert given.headers[tracing.TRACESTATE_HEADER] == "vendor=opaque"  # passed through untouched
    assert tracing.parse(given.headers[tracing.TRACEPARENT_HEADER]).trace_id == GIVEN.split("-")[1]
    assert malformed.ok and json.loads(malformed.body)["traceparent"] == "00-nonsense\x1b"
    restarted = tracing.parse(malformed.headers[tracing.TRACEPARENT_HEADER])  # a new trace, not an error
    assert restarted and restarted.trace_id == json.loads(malformed.body)["correlation_id"]
    assert tracing.parse(json.loads(nested.body)["traceparent"]).trace_id == GIVEN.split("-")[1]

    hops = tracing.read_hops(sent.trace_id, str(log))
    assert [h["event"] for h in hops] == ["publish", "handled", "handled", "handled"]
    assert [h["status"] for h in hops[1:]] == ["requeued", "requeued", "ok"]
    assert hops[-1]["key"] == "k" and hops[-1]["duration_ms"] >= 0 and hops[-1]["parent_id"] == sent.span_id


def test_the_demo_follows_a_cold_start_into_its_worker(pool, planes, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``switchyard demo``'s "Following one request": the workers its control plane starts write their
    ``handled`` hop to the trace log the demo turned on, after the publish and the cold start."""
    log = tmp_path / "trace.jsonl"
    monkeypatch.delenv(tracing.TRACE_LOG_ENV, raising=False)  # restored afterwards
    assert tracing.enable_trace_log(str(log)) == str(log)  # as the demo does, before its driver is made
    name, settings = pool
    driver = demo_driver()
    driver.log_dir = tmp_path / "workers"
    planes.start(name, settings, driver=driver)
    with RpcClient(name, settings, timeout=30) as client:
        assert client.call("infra=42", "hello").ok
    follow_one_request(Printer(), str(log), name)
    out = capsys.readouterr().out
    events = re.findall(r" rpc: ([a-z ]+?)(?: took [0-9.e+-]+ ms)?  ", out)
    assert events == ["publish", "orphan forwarded", "group started", "handled"], out
