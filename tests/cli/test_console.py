"""The console as an operator reads it: seven pools of which one is busy (its figures first, above
the fold; the six idle ones on one line), calls per second per pool and per key, a key's drill-down
(worker ids, latency, its slowest trace's `switchyard trace ID`), the poison count with what to do
about it, every user's name as text. The state is made with the project's own APIs and read from
the page's DOM in headless Chromium, as ``test_status`` does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pika
import pytest

from switchyard.cli.overview import Overview
from switchyard.cli.status import console_figures
from switchyard.core.config import Connections
from switchyard.core.redis_client import connect_redis
from switchyard.local.console import Console
from switchyard.rpc import protocol
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.ports import LatencyReport
from switchyard.rpc.settings import RpcSettings
from switchyard.rpc.store import PoolState, now_ms
from tests.cli.test_status import EVIL_KEY, Figures, chromium
from tests.conftest import ROOT, unique, wait_for

BUSY_KEY = "tenant=busy"
WORKER_ID = "w-console-1"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SCREENSHOT = ROOT / ".local" / "console-seven-pools.png"
FOLD_PX = 900  # the screenshot's window height


@pytest.fixture(scope="module")
def seven_pools() -> Iterator[list[str]]:
    """Six idle pools named to sort before the busy one, and the busy one: two keys with traffic
    (the evil key among them), a worker consuming, three requests waiting, two poison messages."""
    connections, settings = Connections.from_env(), RpcSettings.from_env()
    redis = connect_redis(connections)
    pools = [unique(f"a{i}console") for i in range(6)] + [unique("zconsole")]
    busy = pools[-1]
    topologies = []
    for pool in pools:
        topology = PoolTopology(pool, settings).__enter__()
        topology.declare()
        topologies.append(topology)
    state = PoolState(redis, busy)
    state.touch([BUSY_KEY, EVIL_KEY])
    topologies[-1].ensure_request_queues([BUSY_KEY, EVIL_KEY])
    at = now_ms()
    state.record_latency([LatencyReport(at, BUSY_KEY, 6, 2.0, 8.0 + i, 30.0) for i in range(20)]
                         + [LatencyReport(at, EVIL_KEY, 30, 1.0, 3.0, 4.0)])
    params = pika.URLParameters(connections.amqp_url)
    params.client_properties = {"connection_name": f"switchyard-worker-{WORKER_ID}"}
    amqp = pika.BlockingConnection(params)
    channel = amqp.channel()
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(protocol.request_queue(busy, BUSY_KEY), lambda *_: None)
    other = pika.BlockingConnection(pika.URLParameters(connections.amqp_url)).channel()
    for i in range(3):
        other.basic_publish(protocol.req_exchange(busy), protocol.routing_key(EVIL_KEY), f"r{i}".encode())
    for i in range(2):
        other.basic_publish("", protocol.poison_queue(busy), f"p{i}".encode())
    management = topologies[-1].management
    wait_for(lambda: {(q["name"], q.get("messages"), q.get("consumers"))
                      for q in management.list_queues(f"^{busy}-(req-|poison)")}
             >= {(protocol.request_queue(busy, EVIL_KEY), 3, 0),
                 (protocol.request_queue(busy, BUSY_KEY), 0, 1), (protocol.poison_queue(busy), 2, 0)}
             and any(c.get("queue", {}).get("name") == protocol.request_queue(busy, BUSY_KEY)
                     for c in management.list_consumers()),
             timeout=30, what="the broker's statistics of the busy pool")
    try:
        yield pools
    finally:
        amqp.close()
        other.connection.close()
        for topology in topologies:
            topology.delete(force=True)
            topology.__exit__(None, None, None)
            PoolState(redis, topology.pool).clear()


@pytest.fixture
def console(seven_pools: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    log = tmp_path / "trace.jsonl"
    hops = [{"time": now_ms() / 1000 - 30, "trace_id": TRACE_ID, "process": "worker", "part": "rpc",
             "event": "handled", "duration_ms": 41.5, "pool": seven_pools[-1], "key": BUSY_KEY,
             "worker_id": WORKER_ID},
            {"time": now_ms() / 1000 - 20, "trace_id": "1" * 32, "process": "worker", "part": "rpc",
             "event": "handled", "duration_ms": 3.5, "pool": seven_pools[-1], "key": BUSY_KEY,
             "worker_id": WORKER_ID},
            {"time": now_ms() / 1000 - 10, "trace_id": "2" * 32, "process": "worker", "part": "rpc",
             "event": "handled", "duration_ms": 99.0, "pool": seven_pools[0], "key": BUSY_KEY}]
    log.write_text("".join(json.dumps(hop) + "\n" for hop in hops) + '{"cut by a crash')
    monkeypatch.setenv("SWITCHYARD_TRACE_LOG", str(log))
    overview = Overview(seven_pools)
    with Console(lambda: console_figures(overview), interval_s=60) as running:
        yield running
    overview.close()


def test_seven_pools_the_busy_one_first_above_the_fold(seven_pools: list[str], console: Console) -> None:
    busy = seven_pools[-1]
    page = Figures()
    page.feed(chromium(console.url + "/", "--dump-dom", "--window-size=1280,900"))
    assert page.text("pool-count") == ["7"] and page.text("busy-count") == ["1"]
    drawn = [attrs for attrs, _, _ in page.found if attrs["data-figure"] == "pool"]
    assert [a["data-pool"] for a in drawn] == [busy]  # the only pool drawn in full
    assert 0 < int(drawn[0]["data-top"]) < FOLD_PX / 3
    idle = [a["data-pool"] for a, _, _ in page.found if a["data-figure"] == "idle-pool"]
    assert idle == seven_pools[:6]
    assert page.text("idle-pools")[0].startswith("6 idle pools")
    pool = page.row("pool", pool=busy)
    # 120 calls of BUSY_KEY and 30 of EVIL_KEY in the last minute: 2.5/s
    assert (pool["calls"], pool["workers"], pool["backlog"], pool["poison"]) == ("2.5/s", "1", "3", "2")
    assert pool["latency-p99"] == "27.0 ms"
    assert pool["pool-trace-command"] == f"switchyard trace {TRACE_ID}"  # the slowest of this pool only
    assert page.text("poison-note")[0].startswith("2 poison: set aside for a person")
    assert page.text("poison-note")[0].endswith(f"switchyard pool poison --pool {busy} [--replay]")
    assert page.text("calls-total") == ["2.5/s"]
    rows = [a["data-key"] for a, _, _ in page.found if a["data-figure"] == "group"]
    assert rows == [BUSY_KEY, EVIL_KEY]  # the busiest key first
    key = page.row("group", key=BUSY_KEY)
    figures = (key["calls"], key["latency-p99"], key["workers"], key["backlog"])
    assert figures == ("2.0/s", "27.0 ms", "1", "0")
    detail = page.row("group-detail", key=BUSY_KEY)
    assert detail["worker-ids"] == WORKER_ID
    assert detail["trace-command"] == f"switchyard trace {TRACE_ID}"
    evil = page.row("group", key=EVIL_KEY)
    assert (evil["key"], evil["calls"], evil["backlog"]) == (EVIL_KEY, "0.5/s", "3")
    assert page.row("group-detail", key=EVIL_KEY)["worker-ids"] == "none"
    assert "img" not in page.tags  # the evil key is text, never markup
    charts = {a["data-figure"]: a["data-points"] for a, _, _ in page.found
              if a["data-figure"].startswith("chart-rpc")}
    assert charts == {"chart-rpc-latency": "1", "chart-rpc-calls": "1"}
    SCREENSHOT.parent.mkdir(exist_ok=True)
    chromium(console.url + "/", f"--screenshot={SCREENSHOT}", "--window-size=1280,900", "--hide-scrollbars")
    assert SCREENSHOT.stat().st_size > 10_000


def test_a_link_to_a_key_filters_the_keys_and_opens_its_drill_down(seven_pools: list[str],
                                                                   console: Console) -> None:
    page = Figures()
    page.feed(chromium(f"{console.url}/#key={quote(EVIL_KEY, safe='')}", "--dump-dom"))
    assert [a["data-key"] for a, _, _ in page.found if a["data-figure"] == "group"] == [EVIL_KEY]
    (detail,) = [a for a, _, _ in page.found if a["data-figure"] == "group-detail"]
    assert "hidden" not in detail  # the key named whole: its drill-down open
    assert page.text("filter-count") == [f"1 of 2 keys contain “{EVIL_KEY}”"]
    assert "img" not in page.tags
    page = Figures()
    page.feed(chromium(f"{console.url}/#key=tenant", "--dump-dom"))
    details = [a for a, _, _ in page.found if a["data-figure"] == "group-detail"]
    assert [a["data-key"] for a in details] == [BUSY_KEY] and "hidden" in details[0]  # a part: closed
    page = Figures()
    page.feed(chromium(f"{console.url}/#key=%E0%A4%A", "--dump-dom"))  # a malformed escape
    assert page.text("pool-count") == ["7"]
    assert page.text("filter-count") == ["0 of 2 keys contain “%E0%A4%A”"]


def test_the_figures_hold_the_history_window_and_the_slowest_traces(seven_pools: list[str],
                                                                    console: Console) -> None:
    import requests

    status = requests.get(console.url + "/status.json", timeout=10).json()
    assert (status["history_s"], status["slot_s"], status["delay_history_s"]) == (3600.0, 30.0, 3600.0)
    assert status["traces"][seven_pools[-1]][BUSY_KEY]["trace_id"] == TRACE_ID
    assert status["traces"][seven_pools[0]][BUSY_KEY]["duration_ms"] == 99.0
    (point,) = next(p for p in status["rpc"]["pools"] if p["pool"] == seven_pools[-1])["latency"]
    assert (point["count"], point["calls_per_s"], point["p99_ms"]) == (150, 5.0, 27.0)
