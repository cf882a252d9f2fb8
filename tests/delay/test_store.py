"""The Postgres adapter against the real server: migrations, claims, compare-and-set resets, deletes."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from switchyard.core.config import Connections
from switchyard.delay.model import DelayedMessage
from switchyard.delay.queries import migrations
from switchyard.delay.settings import DelaySettings
from switchyard.delay.store import PostgresDelayStore
from tests.conftest import wait_for
from tests.delay.conftest import in_ms, message

NOW = timedelta(0)


def test_migrations_are_idempotent_and_concurrent_safe(
    settings: DelaySettings, connections: Connections
) -> None:
    stores = [PostgresDelayStore(connections.postgres_dsn, settings.schema) for _ in range(3)]
    results: list[list[int]] = []
    threads = [threading.Thread(target=lambda s=s: results.append(s.migrate())) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [[], [], [m.version for m in migrations()]]  # one migrator applies all
    assert stores[0].migrate() == []
    for s in stores:
        s.close()
    with psycopg.connect(connections.postgres_dsn) as conn:
        indexes = {r[0] for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (settings.schema,))}
    assert {"delayed_messages_waiting", "delayed_messages_ready"} <= indexes
    for s in stores:
        s.close()


def test_insert_ignores_stored_ids_and_keeps_bytes(store: PostgresDelayStore) -> None:
    first = message("a", in_ms(60_000), value=b"\x00\xff", key=None)
    assert store.insert([first, message("b", in_ms(60_000), value=None)]) == {"a", "b"}
    assert store.insert([message("a", in_ms(1), value=b"other"), message("c", in_ms(60_000))]) == {"c"}
    assert store.counts() == (3, 0)
    rows = {r.id: r for r in store.ready(str(uuid.uuid4()), timedelta(days=1), 10)}
    assert (rows["a"].key, rows["a"].value, rows["a"].deadline) == (None, b"\x00\xff", first.deadline)
    assert rows["b"].value is None and rows["a"].headers == (("test-id", b"a"),)


def test_overdue_counts_waiting_rows_due_before_the_cutoff(store: PostgresDelayStore) -> None:
    store.insert([message(f"late-{i}", in_ms(-120_000 - i)) for i in range(3)])
    store.insert([message("recent", in_ms(-1_000)), message("future", in_ms(60_000))])
    minute_ago = datetime.now(UTC) - timedelta(seconds=60)
    assert store.overdue(minute_ago) == 3
    store.ready(str(uuid.uuid4()), timedelta(0), 1)  # a claimed row is being fired, not overdue
    assert store.overdue(minute_ago) == 2


def test_ready_claims_only_due_rows_in_bounded_batches(store: PostgresDelayStore) -> None:
    store.insert([message(f"due-{i}", in_ms(-1000 + i)) for i in range(5)])
    store.insert([message("later", in_ms(60_000))])
    node = str(uuid.uuid4())
    first = store.ready(node, NOW, 3)
    assert [r.id for r in first] == ["due-0", "due-1", "due-2"]  # deadline order, LIMIT respected
    assert [r.id for r in store.ready(node, NOW, 10)] == ["due-3", "due-4"]
    assert store.ready(node, NOW, 10) == []  # never claimed twice
    assert store.counts() == (1, 5)


def test_concurrent_ready_never_double_claims(store: PostgresDelayStore, connections: Connections,
                                              settings: DelaySettings) -> None:
    store.insert([message(f"m{i}", in_ms(-10)) for i in range(2000)])
    claimed: list[list[str]] = [[] for _ in range(4)]

    def claim(i: int) -> None:
        s = PostgresDelayStore(connections.postgres_dsn, settings.schema)
        node = str(uuid.uuid4())
        while rows := s.ready(node, NOW, 50):
            claimed[i].extend(r.id for r in rows)
        s.close()

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for c in claimed for i in c]
    assert len(every) == 2000 and len(set(every)) == 2000


def test_reset_is_a_compare_and_set(store: PostgresDelayStore) -> None:
    store.insert([message(m, in_ms(-10)) for m in ("fired", "reclaimed", "stuck")])
    dead = str(uuid.uuid4())
    readied = {r.id: r for r in store.ready(dead, NOW, 10)}
    stuck = {s.id: s for s in store.find_stuck(timedelta(0), 10)}
    assert set(stuck) == {"fired", "reclaimed", "stuck"} and stuck["stuck"].readied_by == dead
    # Meanwhile the suspected node fires one, and another row is reset and re-readied by a peer.
    assert store.delete([readied["fired"]]) == {"fired"}
    assert store.reset_stuck([stuck["reclaimed"]]) == [stuck["reclaimed"]]
    peer = str(uuid.uuid4())
    assert [r.id for r in store.ready(peer, NOW, 10)] == ["reclaimed"]
    # The reset with the values read earlier touches only the row still as it was.
    assert [s.id for s in store.reset_stuck(list(stuck.values()))] == ["stuck"]
    assert store.counts() == (1, 1)


def test_awkward_ids_and_headers_survive_copy_claim_and_delete(store: PostgresDelayStore) -> None:
    # Insert goes through binary COPY, deletes through a JSON batch: quotes, backslashes, tabs,
    # newlines, non-ASCII and the longest id must come back and be matched exactly.
    ids = ['q"uote', "back\\slash", "tab\tnew\nline", "caf\u00e9-\u2603-\U0001f600", "x" * 128, "[1,2]", "{}"]
    headers = (("h\"1", b"\x00\xff"), ("h\"1", None), ("\u00e9", b""))
    store.insert([DelayedMessage(i, in_ms(-10), i.encode(), None, headers) for i in ids])
    assert store.insert([DelayedMessage(i, in_ms(-10), None, None, ()) for i in ids]) == set()
    rows = store.ready(str(uuid.uuid4()), NOW, 100)
    assert {r.id for r in rows} == set(ids)
    assert all(r.headers == headers and r.key == r.id.encode() and r.value is None for r in rows)
    assert store.delete(rows) == set(ids)
    assert store.counts() == (0, 0)


def test_delete_and_release_match_this_enqueuing_only(store: PostgresDelayStore) -> None:
    store.insert([message("x", in_ms(-10))])
    node = str(uuid.uuid4())
    [old] = store.ready(node, NOW, 1)
    # A peer took over, fired and deleted it; then the same id was enqueued again.
    store.reset_stuck(store.find_stuck(timedelta(0), 10))
    [peer_copy] = store.ready(str(uuid.uuid4()), NOW, 1)
    assert store.delete([peer_copy]) == {"x"}
    store.insert([message("x", in_ms(60_000))])
    assert store.delete([old]) == set()  # gone (a warning for the caller), the new one survives
    assert store.release(node, [old]) == set()
    assert store.counts() == (1, 0)


def test_release_hands_back_only_own_rows(store: PostgresDelayStore) -> None:
    store.insert([message("r", in_ms(-10))])
    node = str(uuid.uuid4())
    rows = store.ready(node, NOW, 1)
    assert store.release(str(uuid.uuid4()), rows) == set()
    assert store.release(node, rows) == {"r"}
    assert store.counts() == (1, 0)


def test_schema_name_is_an_identifier_not_sql(connections: Connections) -> None:
    weird = "delay_" + uuid.uuid4().hex[:8]
    s = PostgresDelayStore(connections.postgres_dsn, weird)
    try:
        assert s.migrate() == [m.version for m in migrations()]
        assert s.counts() == (0, 0)
    finally:
        s.drop_schema()
        s.close()


def test_an_insert_notifies_listeners_of_its_earliest_deadline(store: PostgresDelayStore,
                                                                settings: DelaySettings,
                                                                connections: Connections) -> None:
    """What wakes an idle fire loop: a NOTIFY at commit, and the earliest waiting deadline."""
    assert store.next_deadline() is None
    assert store.wait_enqueued(0.1) == 0.0  # a new LISTEN: whatever came before it was not heard
    assert store.wait_enqueued(0.1) is None
    writer = PostgresDelayStore(connections.postgres_dsn, settings.schema)
    soon, later = in_ms(5_000), in_ms(60_000)
    writer.insert([message("later", later), message("soon", soon)])
    assert abs(store.wait_enqueued(5.0) - soon.timestamp()) < 0.001
    assert store.next_deadline() == soon
    other = PostgresDelayStore(connections.postgres_dsn, settings.schema + "_other")
    other.migrate()
    other.insert([message("elsewhere", in_ms(1_000))])  # another schema: another channel
    assert store.wait_enqueued(0.3) is None
    store.stop_listening()
    other.drop_schema()
    for s in (writer, other):
        s.close()


def test_every_header_survives_the_postgres_round_trip_in_order_traceparent_included(
        store: PostgresDelayStore) -> None:
    """What the scheduler relays is what it stored: names, order, repeats, binary and null values."""
    headers = (("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
               ("tracestate", b"vendor=a,other=b"), ("x-switchyard-key", "k\u00e9y".encode()),
               ("bin", b"\x00\xff\x80"), ("empty", b""), ("null", None), ("bin", b"again"),
               ("\u00fcnicode name", b"v"))
    assert store.insert([DelayedMessage("traced", in_ms(60_000), b"k", b"v", headers)]) == {"traced"}
    (row,) = store.ready(str(uuid.uuid4()), timedelta(days=1), 10)
    assert row.headers == headers


def _sessions(connections: Connections, application_name: str) -> int:
    with psycopg.connect(connections.postgres_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (application_name,)).fetchone()
    return int(row[0]) if row else 0


def test_a_store_closed_on_leaving_its_block_leaves_no_session_behind(settings: DelaySettings,
                                                                       connections: Connections) -> None:
    """A store's watchdog thread holds it, so one never closed keeps its sessions for the process's
    life (a test run once held 84 of Postgres's 100 that way): ``with`` closes it, from every thread."""
    name = f"leak-{uuid.uuid4().hex[:8]}"
    with PostgresDelayStore(connections.postgres_dsn, settings.schema, name) as store:
        store.migrate()
        worker = threading.Thread(target=store.counts)
        worker.start()
        worker.join()
        assert _sessions(connections, name) == 2
    wait_for(lambda: _sessions(connections, name) == 0, timeout=10, what="the store's sessions to end")
