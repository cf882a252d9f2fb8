"""Ready-and-fire and failure detection end to end, with the crash points of at-least-once.

Each test uses its own schema and topics on the real Postgres and tansu; the broker-down test runs
a private tansu it can kill; the Postgres test kills this test's server connections.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from switchyard.core.config import Connections
from switchyard.delay.fire import FireLoop
from switchyard.delay.model import CHRONOS_HEADERS, FireOutcome, SweepOutcome
from switchyard.delay.service import DelayService
from switchyard.delay.settings import DelaySettings
from switchyard.delay.store import PostgresDelayStore
from switchyard.delay.sweep import run_sweeps
from switchyard.local.delay_runtime import LocalRuntime, load_function
from switchyard.local.functions import scheduled_event
from switchyard.local.lambda_context import FakeLambdaContext
from tests.conftest import subprocess_env, wait_for
from tests.delay.conftest import (
    OutputReader,
    ServiceFactory,
    Tansu,
    chronos_headers,
    create_topics,
    in_ms,
    message,
    produce,
    terminate_backends,
)

SHORT_HOLD = {"hold_time_ms": 2500, "publish_timeout_ms": 1000}


class Background:
    """Runs fire loops / sweeps in threads until stopped, like scheduled invocations that end on stop."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.results: list[Any] = []
        self.threads: list[threading.Thread] = []

    def remaining_ms(self) -> int:
        return 0 if self.stop.is_set() else 60_000

    def start(self, run: Callable[[Callable[[], int]], Any]) -> None:
        thread = threading.Thread(target=lambda: self.results.append(run(self.remaining_ms)))
        thread.start()
        self.threads.append(thread)

    def finish(self) -> list[Any]:
        self.stop.set()
        for t in self.threads:
            t.join(15)
        return self.results


@pytest.fixture
def background() -> Any:
    bg = Background()
    yield bg
    bg.finish()


def countdown(ms: int) -> Callable[[], int]:
    """A Lambda invocation's remaining time, starting at ``ms``."""
    deadline = time.monotonic() + ms / 1000
    return lambda: max(0, int((deadline - time.monotonic()) * 1000))


def fire_loop(svc: DelayService) -> FireLoop:
    return FireLoop(svc.store, svc.publisher(), svc.settings, svc.node_id)


def test_message_comes_out_after_its_delay_intact(settings: DelaySettings, connections: Connections,
                                                  store: PostgresDelayStore, output: OutputReader) -> None:
    local = LocalRuntime(settings, connections)
    local.start()
    try:
        deadlines = {"a": in_ms(2500), "b": in_ms(3000)}
        produce(connections.kafka_bootstrap, settings.input_topic, [
            {"key": b"key-a", "value": b'{"x": 1}\x00\xff',
             "headers": [("first", b"1"), *chronos_headers("a", deadlines["a"]), ("test-id", b"a"),
                         ("bin", b"\x00\xff")]},
            {"key": None, "value": None,
             "headers": [*chronos_headers("b", deadlines["b"]), ("test-id", b"b")]},
        ])
        wait_for(lambda: store.counts() == (2, 0), timeout=10, what="both messages enqueued")
        ids = output.wait_for_ids({"a", "b"}, timeout=15)
        wait_for(lambda: store.counts() == (0, 0), timeout=5, what="rows deleted after firing")
    finally:
        local.join()
    assert sorted(ids) == ["a", "b"]
    by_id = {dict(m.headers())["test-id"].decode(): m for m in output.messages}
    a, b = by_id["a"], by_id["b"]
    assert (a.key(), a.value()) == (b"key-a", b'{"x": 1}\x00\xff')
    assert a.headers() == [("first", b"1"), ("test-id", b"a"), ("bin", b"\x00\xff")]
    assert (b.key(), b.value(), b.headers()) == (None, None, [("test-id", b"b")])
    for m in (a, b):
        assert not {h for h, _ in m.headers()} & CHRONOS_HEADERS
        fired_ms = m.timestamp()[1]  # CreateTime: when the scheduler produced it
        deadline_ms = deadlines[dict(m.headers())["test-id"].decode()].timestamp() * 1000
        assert fired_ms >= deadline_ms - settings.timing_advance_ms - 5, "fired before deadline - advance"


def test_two_loops_fire_each_message_once(make_service: ServiceFactory, store: PostgresDelayStore,
                                          output: OutputReader, background: Background) -> None:
    ids = [f"m{i}" for i in range(1500)]
    store.insert([message(i, in_ms(300 + n)) for n, i in enumerate(ids)])  # due over 1.5 s
    nodes = [make_service(), make_service()]
    for svc in nodes:
        background.start(fire_loop(svc).run)
    background.start(lambda remaining: run_sweeps(nodes[0].store, nodes[0].settings, remaining))
    fired = output.wait_for_ids(set(ids), timeout=20)
    wait_for(lambda: store.counts() == (0, 0), timeout=5, what="all rows deleted")
    results = background.finish()
    counts = collections.Counter(fired)
    assert set(counts) == set(ids) and max(counts.values()) == 1
    fires = [r for r in results if isinstance(r, FireOutcome)]
    [sweep] = [r for r in results if isinstance(r, SweepOutcome)]
    assert sum(f.fired for f in fires) == 1500 and all(f.gone_at_delete == 0 for f in fires)
    assert sweep.scans > 0 and sweep.reset == 0  # no failure suspected


class CountingStore(PostgresDelayStore):
    """The real store, counting claims: how often an idle node queries."""

    claims = 0

    def ready(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return super().ready(*args, **kwargs)


def test_idle_loop_sleeps_and_an_enqueue_wakes_it(make_service: ServiceFactory, settings: DelaySettings,
                                                  connections: Connections, output: OutputReader,
                                                  background: Background) -> None:
    """Nothing due: no claim every poll interval; a new message is claimed on its notification."""
    svc = make_service(idle_poll_ms=30_000)
    counting = CountingStore(connections.postgres_dsn, settings.schema, settings.application_name)
    counting.insert([message("later", in_ms(60_000))])  # waiting, far beyond the horizon
    background.start(FireLoop(counting, svc.publisher(), svc.settings, svc.node_id).run)
    time.sleep(2.0)  # window: no claim every poll interval while nothing is due
    idle_claims = counting.claims
    assert 1 <= idle_claims <= 3, idle_claims  # polling every 100 ms would be ~20
    svc.store.insert([message("soon", in_ms(700))])  # another connection: only the NOTIFY tells the loop
    started = time.monotonic()
    assert "soon" in output.wait_for_ids({"soon"}, timeout=15)
    assert time.monotonic() - started < 10  # long before the 30 s idle poll would have found it
    background.finish()
    counting.close()


def test_dead_node_rows_are_fired_by_another_after_the_hold_time(
    make_service: ServiceFactory, store: PostgresDelayStore, output: OutputReader, background: Background,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = [f"d{i}" for i in range(100)]
    store.insert([message(i, in_ms(100)) for i in ids])
    dead = str(uuid.uuid4())
    readied = store.ready(dead, make_service().settings.ready_horizon, 1000)  # ...and then it died
    assert len(readied) == 100
    live = make_service(**SHORT_HOLD)
    background.start(fire_loop(live).run)
    background.start(lambda remaining: run_sweeps(live.store, live.settings, remaining))
    fired = output.wait_for_ids(set(ids), timeout=15)
    wait_for(lambda: store.counts() == (0, 0), timeout=5, what="all rows deleted")
    results = background.finish()
    assert sorted(fired) == sorted(ids)
    readied_at_ms = min(r.readied_at.timestamp() for r in readied) * 1000
    assert min(m.timestamp()[1] for m in output.messages) >= readied_at_ms + SHORT_HOLD["hold_time_ms"] - 5
    [sweep] = [r for r in results if isinstance(r, SweepOutcome)]
    assert sweep.reset == 100
    suspected = [r.getMessage() for r in caplog.records if r.getMessage().startswith("suspected failure")]
    assert len(suspected) == 100 and all(m.startswith(f"suspected failure of {dead} for message d")
                                         for m in suspected)


def test_a_fire_loop_records_its_lateness_for_the_status(
    make_service: ServiceFactory, store: PostgresDelayStore, output: OutputReader,
) -> None:
    """Phase 2 writes each window's lateness (fired rows, p50/p99/max); ``delay_status`` reads it."""
    from datetime import UTC, datetime, timedelta

    from switchyard.delay.status import delay_status

    ids = [f"late{i}" for i in range(20)]
    store.insert([message(i, in_ms(50)) for i in ids])
    svc = make_service()
    loop = fire_loop(svc)
    assert loop.ready_once(time.time()) == 20
    loop.fire_due(time.time() + 10)  # ten seconds late
    loop.collect(svc.publisher().flush(10))
    loop.delete_confirmed(time.time(), force=True)  # the loop's end: the window is written with the deletes
    output.wait_for_ids(set(ids), timeout=10)
    ((_, window),) = store.lateness(datetime.now(UTC) - timedelta(minutes=1))
    assert window.fired == 20 and 9_000 < window.p50_ms <= window.p99_ms <= window.max_ms < 11_000
    status = delay_status(store)
    assert status.lateness_p99_ms == window.p99_ms and (status.waiting, status.ready) == (0, 0)
    assert [point.fired for point in status.lateness] == [20]


def test_crash_after_publish_before_delete_duplicates_but_loses_nothing(
    make_service: ServiceFactory, store: PostgresDelayStore, output: OutputReader, background: Background,
) -> None:
    ids = [f"c{i}" for i in range(50)]
    store.insert([message(i, in_ms(50)) for i in ids])
    crashing = make_service(**SHORT_HOLD)
    loop = fire_loop(crashing)
    assert loop.ready_once(time.time()) == 50
    loop.fire_due(time.time() + 10)  # publish everything held...
    loop.collect(crashing.publisher().flush(10))  # ...the broker confirms...
    assert loop.outcome().fired == 50 and store.counts() == (0, 50)  # ...and the node dies before deleting
    output.wait_for_ids(set(ids), timeout=10)
    survivor = make_service(**SHORT_HOLD)
    background.start(fire_loop(survivor).run)
    background.start(lambda remaining: run_sweeps(survivor.store, survivor.settings, remaining))
    wait_for(lambda: store.counts() == (0, 0), timeout=15, what="rows fired again and deleted")
    output.wait_for_ids(set(ids), timeout=5)
    output.poll(0.5)
    counts = collections.Counter(output.ids())
    assert set(counts) == set(ids) and min(counts.values()) == 2  # duplicated, never lost


def test_output_broker_down_leaves_rows_then_fires_after_it_returns(
    make_service: ServiceFactory, store: PostgresDelayStore, settings: DelaySettings,
    connections: Connections, private_tansu: Tansu, background: Background,
) -> None:
    create_topics(private_tansu.bootstrap, settings.output_topic)
    ids = [f"b{i}" for i in range(30)]
    store.insert([message(i, in_ms(800)) for i in ids])
    svc = make_service(connections_=Connections(postgres_dsn=connections.postgres_dsn,
                                                kafka_bootstrap=private_tansu.bootstrap),
                       publish_timeout_ms=800)
    svc.publisher()  # connect while the broker is up, as a running node would be
    private_tansu.kill()
    background.start(fire_loop(svc).run)
    time.sleep(3.0)  # window: the deadlines pass while the broker is down; nothing is deleted
    waiting, ready = store.counts()
    assert waiting + ready == 30, "rows must stay in place while nothing is confirmed"
    private_tansu.start()  # memory storage: an empty broker, so recreate the topic
    create_topics(private_tansu.bootstrap, settings.output_topic)
    wait_for(lambda: store.counts() == (0, 0), timeout=30, what="rows fired after the broker returned")
    [outcome] = background.finish()
    assert outcome.publish_failures > 0 and outcome.fired >= 30
    # Every partition: the publisher may have auto-created the topic (4 on tansu) before create_topics.
    reader = OutputReader(private_tansu.bootstrap, settings.output_topic, partitions=None)
    try:
        assert set(reader.wait_for_ids(set(ids), timeout=10)) == set(ids)
    finally:
        reader.close()


def test_postgres_connections_lost_mid_run_recovers_and_loses_nothing(
    settings: DelaySettings, connections: Connections, store: PostgresDelayStore, output: OutputReader,
) -> None:
    local = LocalRuntime(settings, connections)
    local.start()
    ids = [f"p{i}" for i in range(300)]
    try:
        produce(connections.kafka_bootstrap, settings.input_topic, [
            {"value": i.encode(),
             "headers": [*chronos_headers(i, in_ms(1500 + 8 * n)), ("test-id", i.encode())]}
            for n, i in enumerate(ids)])
        killed = 0
        for _ in range(6):  # every half second while messages are enqueued, readied and fired
            time.sleep(0.5)  # pace: a kill every half second
            killed += terminate_backends(connections.postgres_dsn, settings.application_name)
        assert killed >= 3
        fired = output.wait_for_ids(set(ids), timeout=30)
        wait_for(lambda: store.counts() == (0, 0), timeout=10, what="all rows deleted")
    finally:
        local.join()
    assert set(fired) == set(ids)


def test_a_message_the_broker_refuses_for_good_is_parked_not_retried_forever(
    make_service: ServiceFactory, store: PostgresDelayStore, output: OutputReader,
) -> None:
    """Too large for the output topic: moved to parked_messages with the reason, counted, and never
    readied again; the messages around it fire as usual. (Before: released and retried every poll.)"""
    svc = make_service(max_message_bytes=1000)
    store.insert([message("small-1", in_ms(200)), message("huge", in_ms(250), value=b"x" * 5000),
                  message("small-2", in_ms(300))])
    first = fire_loop(svc).run(countdown(svc.settings.stop_margin_ms + 1500))
    assert (first.fired, first.parked) == (2, 1) and first.released == 0
    assert set(output.wait_for_ids({"small-1", "small-2"}, timeout=10)) == {"small-1", "small-2"}
    assert store.counts() == (0, 0)  # nothing left to retry
    [parked] = store.parked()
    assert (parked.id, parked.size) == ("huge", 5000) and "refuses this message" in parked.reason
    again = fire_loop(svc).run(countdown(svc.settings.stop_margin_ms + 500))
    assert (again.readied, again.parked, again.publish_failures) == (0, 0, 0)
    assert "huge" not in output.ids()


def replay(settings: DelaySettings, *args: str) -> dict[str, Any]:
    """``switchyard delay replay ARGS --json`` on the test's schema."""
    run = subprocess.run([sys.executable, "-m", "switchyard", "delay", "replay", *args, "--json"],
                         env=subprocess_env(SWITCHYARD_DELAY_SCHEMA=settings.schema), capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


def test_parked_messages_replayed_once_their_cause_is_fixed_fire_and_a_reused_id_stays_parked(
    make_service: ServiceFactory, store: PostgresDelayStore, output: OutputReader, settings: DelaySettings,
) -> None:
    """`switchyard delay replay`: parked messages wait again, due now, and fire once the broker takes
    them, intact. A parked id waiting again under a new message stays parked (replaying it would
    drop one of the two); an id not parked is named, and nothing else moves."""
    small = make_service(max_message_bytes=1000)
    store.insert([message("huge-1", in_ms(100), value=b"x" * 5000),
                  message("huge-2", in_ms(150), value=b"y" * 5000)])
    assert fire_loop(small).run(countdown(small.settings.stop_margin_ms + 1500)).parked == 2
    store.insert([message("huge-2", in_ms(3_600_000), value=b"new")])  # a new message reuses the id
    assert replay(settings, "--all") == {"replayed": ["huge-1"], "not_replayed": [], "parked_left": 1}
    assert [row[0] for row in store.parked()] == ["huge-2"] and store.counts() == (2, 0)
    fixed = make_service(max_message_bytes=10_000)  # the cause fixed: the topic takes large messages
    fired = fire_loop(fixed).run(countdown(fixed.settings.stop_margin_ms + 1500))
    assert (fired.fired, fired.parked) == (1, 0)
    assert output.wait_for_ids({"huge-1"}, timeout=10).count("huge-1") == 1
    [record] = [m for m in output.messages if m.value() == b"x" * 5000]
    assert record.key() == b"k" and record.headers() == [("test-id", b"huge-1")]
    assert replay(settings, "--id", "huge-2", "--id", "never-parked") == {
        "replayed": [], "not_replayed": ["huge-2", "never-parked"], "parked_left": 1}
    assert store.counts() == (1, 0)  # the new huge-2 waits for its own deadline


def test_stopping_the_local_runtime_settles_what_it_holds(
    settings: DelaySettings, connections: Connections, store: PostgresDelayStore, output: OutputReader,
) -> None:
    """`switchyard delay run` stopped mid-stream: what fired is deleted, what was held is released,
    so nothing refires after the hold time (a graceful stop duplicated work before)."""
    local = LocalRuntime(settings, connections, roles=("fire",))
    local.start()
    ids = [f"stop{i}" for i in range(400)]
    store.insert([message(i, in_ms(500 + 5 * n)) for n, i in enumerate(ids)])  # due over two seconds
    # Stop mid-stream: while rows are held, fired, or confirmed and waiting for their delete.
    wait_for(lambda: len(set(output.poll(0.05) and output.ids()) & set(ids)) >= len(ids) // 4, timeout=30,
             interval=0.01, what="a quarter of the rows fired")
    local.join()
    waiting, readied = store.counts()
    assert readied == 0, "rows left readied would be fired again by failure detection"
    fired = set(output.poll(2.0) and output.ids()) & set(ids)
    assert 0 < len(fired) < len(ids) and waiting == len(ids) - len(fired)
    assert len(output.ids()) == len(set(output.ids()))  # nothing fired twice


def backends(dsn: str, application_name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (application_name,)).fetchone()
    return row[0] if row else 0


def test_warm_fire_invocations_hold_a_constant_number_of_connections(
    handler_service: DelayService, settings: DelaySettings, connections: Connections, output: OutputReader,
) -> None:
    """A warm Lambda (or a long ``switchyard delay run``) invokes the fire handler again and again."""
    fire_handler = load_function("fire").lambda_handler
    timeout_ms = settings.stop_margin_ms + 300  # each invocation loops ~0.3 s, then drains and returns
    counts = []
    for n in range(10):
        handler_service.store.insert([message(f"w{n}", in_ms(100))])
        context = FakeLambdaContext("delay_fire", timeout_ms)
        result = fire_handler(scheduled_event("switchyard-delay_fire"), context)
        assert result["fired"] == 1
        # A closed connection's server process exits a moment later: let the count settle.
        wait_for(lambda: backends(connections.postgres_dsn, settings.application_name) <= 2, timeout=5,
                 what="at most 2 backends")
        counts.append(backends(connections.postgres_dsn, settings.application_name))
    assert counts == [counts[0]] * 10 and counts[0] <= 2, counts
    ids = {f"w{n}" for n in range(10)}
    assert set(output.wait_for_ids(ids, timeout=10)) == ids
