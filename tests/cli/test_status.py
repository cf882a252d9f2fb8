"""``switchyard status`` and ``switchyard console`` against a known state in the real services.

The state is made with the project's own APIs: a pool with two groups in Redis and RabbitMQ (one
with three requests waiting, one with a consumer; a worker latency report), delay rows (waiting,
ready, overdue, parked; a lateness window), a bus subscriber with queued events, and a pending
request. The figures shown must be exactly those. The console test loads the page in headless
Chromium (Debian's ``chromium``, which ``./dev`` installs) and reads the figures from its DOM.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pika
import pytest
import requests

from switchyard.bus.settings import BusSettings
from switchyard.bus.store import BusStore
from switchyard.cli.overview import PARTS, Overview
from switchyard.cli.status import age, ago
from switchyard.core.config import Connections
from switchyard.core.observability import printable
from switchyard.core.redis_client import connect_redis
from switchyard.delay.model import DelayedMessage, LatenessWindow
from switchyard.delay.store import PostgresDelayStore
from switchyard.local.console import Console
from switchyard.pending import CancelToken, PendingQueue
from switchyard.pending.settings import PendingSettings
from switchyard.rpc import protocol
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.ports import GroupStatus, LatencyReport
from switchyard.rpc.settings import RpcSettings
from switchyard.rpc.store import PoolState, now_ms
from tests.conftest import ROOT, subprocess_env, unique, wait_for

CHROMIUM = "/usr/bin/chromium"
BUSY_KEY = "tenant=1"
EVIL_KEY = '<img src=x onerror="document.title=\'owned\'">&amp;'  # any UTF-8 is a key
SCREENSHOT = ROOT / ".local" / "console.png"


@dataclass(frozen=True)
class System:
    pool: str
    env: dict[str, str]  # the settings that point a process at this state


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    connections = Connections.from_env()
    settings = RpcSettings.from_env()
    redis = connect_redis(connections)
    pool, schema, bus_name, prefix = unique("status"), unique("status"), unique("status"), unique("status")
    # rpc: BUSY_KEY active with 3 requests waiting; EVIL_KEY unbound with one consumer
    topology = PoolTopology(pool, settings).__enter__()
    topology.declare()
    state = PoolState(redis, pool)
    state.touch([BUSY_KEY, EVIL_KEY])
    assert state.set_status(state.get(EVIL_KEY), GroupStatus.UNBOUND)
    topology.ensure_request_queues([BUSY_KEY, EVIL_KEY])
    state.record_latency([LatencyReport(now_ms(), BUSY_KEY, 10, 2.0, 7.5, 9.0)])
    amqp = pika.BlockingConnection(pika.URLParameters(connections.amqp_url))
    channel = amqp.channel()
    for i in range(3):
        channel.basic_publish(protocol.req_exchange(pool), protocol.routing_key(BUSY_KEY), f"r{i}".encode())
    channel.basic_consume(protocol.request_queue(pool, EVIL_KEY), lambda *_: None)
    wait_for(lambda: {(q["name"], q.get("messages"), q.get("consumers"))
                      for q in topology.management.list_queues(f"^{pool}-req-")}
             == {(protocol.request_queue(pool, BUSY_KEY), 3, 0),
                 (protocol.request_queue(pool, EVIL_KEY), 0, 1)},
             timeout=20, what="the broker's statistics of the request queues")
    # delay: 2 waiting in the future, 1 waiting overdue, 1 ready (claimed), 1 parked
    store = PostgresDelayStore(connections.postgres_dsn, schema)
    store.migrate()
    now = datetime.now(UTC)
    past = now - timedelta(minutes=2)
    store.insert([DelayedMessage(f"d{i}", now + timedelta(hours=1), None, b"v", ()) for i in range(2)])
    store.insert([DelayedMessage(f"claimed{i}", past, None, b"v", ()) for i in range(2)])
    node = "00000000-0000-0000-0000-000000000001"
    claimed = store.ready(node, timedelta(0), 10)
    assert len(claimed) == 2 and store.park(node, [(claimed[0], "too large")])
    store.insert([DelayedMessage("late", past, None, b"v", ())])
    store.record_lateness(node, LatenessWindow(40, 1.5, 12.5, 20.0))
    # bus: one subscriber with 3 events queued (batches of 2)
    bus = BusStore(redis, BusSettings(name=bus_name))
    subscriber = bus.create_token("status-sub")
    bus.subscribe(subscriber, ["orders"], "https://sub.example/events", "u", 2, 3_600_000)
    publisher = bus.create_token("status-pub")
    for i in range(3):
        bus.publish("orders", publisher, json.dumps({"n": i}))
    # pending: one request waiting for a polling service
    pending = PendingQueue(PendingSettings(prefix=prefix)).start()
    cancel = CancelToken()
    caller = threading.Thread(target=_ignore_errors, args=(pending.queue_and_wait, "billing"),
                              kwargs={"cancel": cancel, "pickup_timeout": 300}, daemon=True)
    caller.start()
    wait_for(lambda: pending.status().get("billing", {}).get("waiting") == 1, what="the pending request")
    env = {"SWITCHYARD_DELAY_SCHEMA": schema, "SWITCHYARD_BUS_NAME": bus_name,
           "SWITCHYARD_PENDING_PREFIX": prefix}
    try:
        yield System(pool, env)
    finally:
        cancel.cancel()
        caller.join(10)
        pending.close()
        amqp.close()
        topology.delete(force=True)
        topology.__exit__(None, None, None)
        state.clear()
        store.drop_schema()
        store.close()
        keys = list(redis.scan_iter(match=f"*{{{bus_name}}}*", count=1000))
        if keys:
            redis.delete(*keys)


def _ignore_errors(call, *args, **kwargs) -> None:
    with contextlib.suppress(Exception):  # cancelled at teardown
        call(*args, **kwargs)


def switchyard(system: System, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "switchyard", *args], capture_output=True, text=True,
                          env=subprocess_env(**system.env, **env), timeout=60)


def check_figures(status: dict, pool: str) -> None:
    """The figures ``status`` (the --json form) holds are those the fixture made."""
    (figures,) = status["rpc"]["pools"]
    assert figures["pool"] == pool
    groups = {g["key"]: (g["state"], g["workers"], g["backlog"]) for g in figures["groups"]}
    assert groups == {BUSY_KEY: ("active", 0, 3), EVIL_KEY: ("unbound", 1, 0)}
    assert figures["latency_p99_ms"] == 7.5 and len(figures["latency"]) == 1
    delay = status["delay"]
    assert (delay["waiting"], delay["ready"], delay["overdue"], delay["parked"]) == (3, 1, 1, 1)
    assert 100 < delay["oldest_due_s"] < 300 and delay["lateness_p99_ms"] == 12.5
    (sub,) = status["bus"]["subscribers"]
    assert (sub["name"], sub["events"], sub["batches"], sub["health_points"]) == ("status-sub", 3, 2, 100)
    (billing,) = status["pending"]["endpoints"]
    assert billing == {"endpoint": "billing", "waiting": 1, "queued": 1, "taken": 0, "answered": 0,
                       "oldest_age_s": billing["oldest_age_s"]}
    assert {status[part]["state"] for part in PARTS} == {"ok"}


def test_status_json_and_human(system: System) -> None:
    done = switchyard(system, "status", "--pool", system.pool, "--json")
    assert done.returncode == 0, done.stderr
    check_figures(json.loads(done.stdout), system.pool)
    human = switchyard(system, "status", "--pool", system.pool)
    assert human.returncode == 0, human.stderr
    out = human.stdout
    assert (f"{system.pool}: 2 groups; orphans 0, dead letters 0, poison 0; spares 0; "
            "latency p99 7.5 ms") in out
    assert "3 waiting, 1 ready, 1 overdue, 1 parked; earliest waiting row due 2 min ago" in out
    assert "lateness p99 12.5 ms" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("    '")}
    assert rows[repr(BUSY_KEY)][:3] == ["active", "0", "3"]
    assert "status-sub" in out and "billing" in out


def test_status_watch_refreshes_count_times(system: System) -> None:
    lines = switchyard(system, "status", "--pool", system.pool, "--json", "--watch", "--count", "2",
                       "--interval", "0.2").stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        check_figures(json.loads(line), system.pool)
    frames = switchyard(system, "status", "--pool", system.pool, "--watch", "--count", "2",
                        "--interval", "0.2")
    assert frames.returncode == 0 and frames.stdout.count("\x1b[H\x1b[2J") == 2


def test_watch_ends_quietly_on_ctrl_c(system: System) -> None:
    watch = subprocess.Popen([sys.executable, "-m", "switchyard", "status", "--pool", system.pool, "--watch",
                              "--json", "--interval", "0.2"], env=subprocess_env(**system.env),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert watch.stdout is not None
        check_figures(json.loads(watch.stdout.readline()), system.pool)  # a first frame, then Ctrl-C
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=30)
        assert (watch.returncode, err) == (0, "")
    finally:
        watch.kill()  # one that ignored Ctrl-C must not outlive the test (polling the services)
        watch.wait()


def test_names_and_times_read_as_a_person_reads_them() -> None:
    assert printable("tenant=\x1b[31mred\n") == "tenant=\\x1b[31mred\\n"  # no terminal escapes
    assert printable("x" * 40, 10) == "x" * 9 + "…"
    ages = [age(s) for s in (None, 0.4, 59, 61, 7200, 3 * 86400)]
    assert ages == ["-", "0 s", "59 s", "1 min", "2 h", "3 d"]
    assert ago(None, 0) == "never" and ago(100, 130) == "30 s ago"


def test_a_part_that_is_down_is_named_and_the_others_are_shown(system: System) -> None:
    done = switchyard(system, "status", "--pool", system.pool, "--json",
                      SWITCHYARD_POSTGRES_DSN="postgresql://postgres:hunter2@127.0.0.1:1/switchyard")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["delay"] == {"state": "unreachable",
                               "reason": "cannot reach Postgres at 127.0.0.1:1 (SWITCHYARD_POSTGRES_DSN): "
                                         "connection refused; start Postgres there, or set "
                                         "SWITCHYARD_POSTGRES_DSN to where it runs (in a Switchyard "
                                         "checkout: ./dev services)"}
    assert status["bus"]["subscribers"][0]["events"] == 3 and len(status["rpc"]["pools"]) == 1
    human = switchyard(system, "status", "--pool", system.pool,
                       SWITCHYARD_POSTGRES_DSN="postgresql://postgres:hunter2@127.0.0.1:1/switchyard")
    assert "Delay scheduler\n  unreachable: cannot reach Postgres at 127.0.0.1:1" in human.stdout
    assert "hunter2" not in human.stdout + human.stderr


def test_existing_commands_show_the_same_figures(system: System) -> None:
    pool = json.loads(switchyard(system, "pool", "status", "--pool", system.pool, "--json").stdout)
    assert {g["key"]: g["backlog"] for g in pool["groups"]} == {BUSY_KEY: 3, EVIL_KEY: 0}
    delay = json.loads(switchyard(system, "delay", "status", "--json").stdout)
    assert (delay["waiting"], delay["overdue"], delay["parked"]) == (3, 1, 1)


class Figures(HTMLParser):
    """The elements of a dumped DOM that carry ``data-figure``: attributes, text and the nearest
    enclosing element with a ``data-figure`` (a table row for its cells, a pool for its figures)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[dict[str, str], str, dict[str, str] | None]] = []
        self.tags: list[str] = []
        self._open: list[tuple[str, dict[str, str], list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)
        self._open.append((tag, {k: v or "" for k, v in attrs}, []))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            open_tag, attrs, text = self._open.pop()
            if "data-figure" in attrs:
                parent = next((a for _, a, _ in reversed(self._open) if "data-figure" in a), None)
                self.found.append((attrs, "".join(text), parent))
            if self._open:
                self._open[-1][2].extend(text)
            if open_tag == tag:
                return

    def handle_data(self, data: str) -> None:
        if self._open:
            self._open[-1][2].append(data)

    def text(self, figure: str) -> list[str]:
        """The texts of every element ``data-figure=figure``, in the page's order of closing."""
        return [text for attrs, text, _ in self.found if attrs["data-figure"] == figure]

    def row(self, figure: str, **match: str) -> dict[str, str]:
        """The figures inside the one element ``data-figure=figure`` with attributes ``match``."""
        (row,) = [a for a, _, _ in self.found if a["data-figure"] == figure
                  and all(a.get(f"data-{k}") == v for k, v in match.items())]
        return {a["data-figure"]: text for a, text, parent in self.found if parent is row}


def chromium(url: str, *extra: str) -> str:
    assert os.path.exists(CHROMIUM), "Debian's chromium is missing: ./dev installs it (apt-get install)"
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                               "--no-first-run", "--disable-background-networking",
                               "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                               "--virtual-time-budget=3000", *extra, url],
                              capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture
def console(system: System, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    for name, value in system.env.items():
        monkeypatch.setenv(name, value)
    overview = Overview([system.pool])
    with Console(lambda: overview.read().to_dict(), interval_s=60) as running:
        yield running
    overview.close()


def test_console_page_shows_the_figures_in_chromium(system: System, console: Console) -> None:
    status = requests.get(console.url + "/status.json", timeout=10).json()
    check_figures(status, system.pool)
    page = Figures()
    page.feed(chromium(console.url + "/", "--dump-dom"))
    assert page.text("pool-count") == ["1"]
    pool = page.row("pool", pool=system.pool)
    assert [pool[f] for f in ("groups", "workers", "backlog", "latency-p99")] == ["2", "1", "3", "7.5 ms"]
    assert (pool["orphans"], pool["dead-letters"], pool["poison"], pool["spares"]) == ("0", "0", "0", "0")
    busy, evil = page.row("group", key=BUSY_KEY), page.row("group", key=EVIL_KEY)
    assert [busy[f] for f in ("key", "state", "workers", "backlog")] == [BUSY_KEY, "active", "0", "3"]
    assert [evil[f] for f in ("key", "state", "workers", "backlog")] == [EVIL_KEY, "unbound", "1", "0"]
    assert busy["last-activity"].endswith(" s ago")
    delay = ("waiting", "ready", "overdue", "parked", "lateness-p99")
    assert [page.text(f"delay-{name}") for name in delay] == [["3"], ["1"], ["1"], ["1"], ["12.5 ms"]]
    assert page.text("delay-oldest-due") == ["2 min ago"]
    sub = page.row("subscriber", name="status-sub")
    assert (sub["queued"], sub["batches"], sub["health"]) == ("3", "2", "100")
    endpoint = page.row("endpoint", name="billing")
    assert (endpoint["waiting"], endpoint["taken"], endpoint["answered"]) == ("1", "0", "0")
    charts = {a["data-figure"]: a["data-points"] for a, _, _ in page.found
              if a["data-figure"].startswith("chart-")}
    assert charts == {"chart-rpc-latency": "1", "chart-rpc-calls": "1", "chart-delay-lateness": "1"}
    # the parked message, with the commands that read and replay it beside it
    assert page.text("delay-replay-command") == ["switchyard delay parked", "switchyard delay replay --all"]
    assert not page.text("unreachable")
    # the user's key is text in the page, never markup: no <img> element came of it
    assert "img" not in page.tags
    SCREENSHOT.parent.mkdir(exist_ok=True)
    chromium(console.url + "/", f"--screenshot={SCREENSHOT}", "--window-size=1280,900", "--hide-scrollbars")
    assert SCREENSHOT.stat().st_size > 10_000


def test_console_answers_figures_page_and_script_only(console: Console) -> None:
    page = requests.get(console.url + "/", timeout=10)
    assert page.status_code == 200 and "script-src 'self'" in page.headers["Content-Security-Policy"]
    script = requests.get(console.url + "/console.js", timeout=10)
    assert script.headers["Content-Type"].startswith("text/javascript")
    assert requests.get(console.url + "/../etc/passwd", timeout=10).status_code == 404
    assert requests.post(console.url + "/status.json", timeout=10).status_code == 405


def test_console_refuses_to_start_when_nothing_answers(system: System) -> None:
    closed = {"SWITCHYARD_REDIS_URL": "redis://127.0.0.1:1/0", "SWITCHYARD_MANAGEMENT_URL": "http://127.0.0.1:1",
              "SWITCHYARD_POSTGRES_DSN": "postgresql://postgres@127.0.0.1:1/switchyard"}
    started = time.monotonic()
    done = switchyard(system, "console", "--port", "0", **closed)
    assert done.returncode == 1 and time.monotonic() - started < 20
    assert done.stderr.startswith("switchyard: error: no part of Switchyard could be read: rpc: cannot reach")
    assert len(done.stderr.strip().splitlines()) == 1



def test_console_answers_only_its_own_host_names_and_refuses_to_be_framed() -> None:
    """A DNS-rebinding page (evil.example resolving to 127.0.0.1) read /status.json: the console
    answered any Host. And nothing stopped another site from framing the page."""
    with Console(lambda: {"at": 1.0}, interval_s=60) as running:
        port = running.url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LocalHost", f"[::1]:{port}"):
            ok = requests.get(running.url + "/status.json", headers={"Host": host}, timeout=10)
            assert ok.status_code == 200, host
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
            for path in ("/", "/status.json", "/console.js"):
                refused = requests.get(running.url + path, headers={"Host": host}, timeout=10)
                assert (refused.status_code, "at" in refused.text) == (421, False), (host, path)
        page = requests.get(running.url + "/", timeout=10)
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"


def test_the_console_binds_a_name_and_accepts_that_name() -> None:
    with Console(lambda: {"at": 1.0}, host="localhost", interval_s=60) as running:
        port = running.url.rsplit(":", 1)[1]
        assert requests.get(running.url + "/status.json", timeout=10).status_code == 200
        assert requests.get(running.url + "/", headers={"Host": f"elsewhere:{port}"},
                            timeout=10).status_code == 421


STATUS_WORDS = ("unreachable", "state", "reason", "ok", "endpoints")


def named_like_status_words() -> dict:
    """A status whose every user-chosen name is a word the document itself uses; the delay part down."""
    from switchyard.bus.status import SubscriberGauge, Telemetry
    from switchyard.cli.overview import PartStatus, PoolsStatus, SystemStatus
    from switchyard.pending.status import EndpointStatus, PendingStatus
    from switchyard.rpc.status import GroupFigures, PoolFigures

    pools = PoolsStatus((PoolFigures("unreachable", (GroupFigures("unreachable", "active", 1, 0, None),),
                                     0, 0, 0, None, ()),))
    bus = Telemetry((SubscriberGauge("unreachable", 1, 1, 0, 100),), {}, 0, 0)
    pending = PendingStatus(tuple(EndpointStatus(name, i, i, 0, 0, 0.0)
                                  for i, name in enumerate(STATUS_WORDS)))
    down = PartStatus("delay", None, "cannot reach Postgres")
    return SystemStatus(1.0, None, (PartStatus("rpc", pools), down, PartStatus("bus", bus),
                                    PartStatus("pending", pending))).to_dict()


def test_a_name_that_is_a_status_word_reads_as_a_name_in_json_and_in_the_console() -> None:
    """A pending endpoint named ``unreachable`` made the console show the pending part as
    unreachable (and hide the other endpoints), and ``status --json`` read the same either way."""
    status = named_like_status_words()
    states = {name: status[name]["state"] for name in PARTS}
    assert states == {**dict.fromkeys(PARTS, "ok"), "delay": "unreachable"}
    assert [e["endpoint"] for e in status["pending"]["endpoints"]] == list(STATUS_WORDS)
    with Console(lambda: status, interval_s=60) as running:
        page = Figures()
        page.feed(chromium(running.url + "/", "--dump-dom"))
    assert page.text("unreachable") == ["unreachable: cannot reach Postgres"]  # the delay part only
    assert [page.row("endpoint", name=name)["waiting"] for name in STATUS_WORDS] == ["0", "1", "2", "3", "4"]
    assert page.row("pool", pool="unreachable")["groups"] == "1"
    assert page.row("subscriber", name="unreachable")["queued"] == "1"


def test_a_part_that_is_down_reads_as_its_state_and_reason() -> None:
    from switchyard.cli.overview import PartStatus

    assert PartStatus("delay", None, "cannot reach Postgres").to_dict() == {
        "state": "unreachable", "reason": "cannot reach Postgres"}
