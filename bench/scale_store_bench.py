"""How the delay store's cost grows with the rows waiting in it (``--rows 1000000 3000000 10000000``).

In a database of its own (``--database``, default ``scale_bench``, created and dropped by the
run), the delay store's schema is filled with waiting rows (deadlines a day or more away, 10 ms
apart, 100-byte values, filled by one
``INSERT ... SELECT generate_series`` per step: the fill is not what is measured). At each size:

- enqueue: ``insert`` of batches of 1,000 messages through the store (the COPY path), ms per batch;
- fire: 1,000 rows due now, claimed by ``ready`` and removed by ``delete`` (the two phases);
- the planner's view: ``next_deadline`` and ``overdue`` (through the partial index);
- the partial index's, the table's and the whole relation's size on disk, per million rows;
- ``VACUUM`` of the table after the fire (what autovacuum does), its time.

    .venv/bin/python bench/scale_store_bench.py [--rows 1000000 3000000 10000000] [--busy]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale_bench import busy_load  # noqa: E402
from bench.stats import load_average  # noqa: E402
from switchyard.core.config import Connections  # noqa: E402
from switchyard.delay.model import DelayedMessage  # noqa: E402
from switchyard.delay.store import PostgresDelayStore  # noqa: E402

DEFAULT_DATABASE = "scale_bench"
SCHEMA = "scale_delay"
BATCH = 1000


def with_database(dsn: str, database: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=database)


def admin(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


def fill(dsn: str, start: int, stop: int) -> float:
    """Waiting rows ``start..stop-1``, deadlines a day away and 10 ms apart; returns seconds taken."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.delayed_messages (id, deadline, message_key, message_value) "
            "SELECT 'fill-' || n, now() + interval '1 day' + n * interval '10 milliseconds', "
            "convert_to('k' || n, 'UTF8'), decode(repeat('ab', 100), 'hex') "
            "FROM generate_series(%s::bigint, %s::bigint - 1) AS n", (start, stop))
    return time.perf_counter() - started


def messages(count: int, deadline: datetime) -> list[DelayedMessage]:
    tag = uuid.uuid4().hex[:8]
    return [DelayedMessage(f"bench-{tag}-{n}", deadline, b"k", b"v" * 100, ()) for n in range(count)]


def timed(operation: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = operation(*args)
    return (time.perf_counter() - started) * 1000, result


def measure(store: PostgresDelayStore, dsn: str, rows: int, rounds: int) -> dict[str, Any]:
    row: dict[str, Any] = {"rows": rows, "load_before": load_average()}
    far = datetime.now(UTC) + timedelta(days=3)
    enqueue, fire_ready, fire_delete = [], [], []
    for _ in range(rounds):
        ms, _ = timed(store.insert, messages(BATCH, far))
        enqueue.append(ms)
        store.insert(messages(BATCH, datetime.now(UTC) - timedelta(seconds=1)))
        ms, ready = timed(store.ready, "00000000-0000-0000-0000-000000000001", timedelta(0), BATCH)
        fire_ready.append(ms)
        assert len(ready) == BATCH, len(ready)
        ms, deleted = timed(store.delete, ready)
        fire_delete.append(ms)
        assert len(deleted) == BATCH, len(deleted)
    row["enqueue_ms_per_1000"] = statistics.median(enqueue)
    row["ready_ms_per_1000"] = statistics.median(fire_ready)
    row["delete_ms_per_1000"] = statistics.median(fire_delete)
    row["next_deadline_ms"] = statistics.median(timed(store.next_deadline)[0] for _ in range(5))
    row["overdue_ms"] = statistics.median(
        timed(store.overdue, datetime.now(UTC))[0] for _ in range(5))
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute(f"VACUUM {SCHEMA}.delayed_messages")
        row["vacuum_s"] = time.perf_counter() - started
        sizes = conn.execute(
            "SELECT pg_relation_size(%s), pg_relation_size(%s), pg_total_relation_size(%s)",
            (f"{SCHEMA}.delayed_messages_waiting", f"{SCHEMA}.delayed_messages",
             f"{SCHEMA}.delayed_messages")).fetchone()
    assert sizes is not None
    million = rows / 1e6
    row["waiting_index_mb_per_million"] = sizes[0] / 1e6 / million
    row["table_mb_per_million"] = sizes[1] / 1e6 / million
    row["total_mb_per_million"] = sizes[2] / 1e6 / million
    row["load_after"] = load_average()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 3_000_000, 10_000_000],
                        help="waiting rows at each measured step (increasing)")
    parser.add_argument("--rounds", type=int, default=5, help="enqueue and fire batches per step")
    parser.add_argument("--busy", action="store_true", help="a spinning process pinned to core 1")
    parser.add_argument("--database", default=DEFAULT_DATABASE,
                        help="the database made (and dropped) for the run")
    args = parser.parse_args(argv)
    base = Connections.from_env().postgres_dsn
    database = args.database
    admin(base, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")  # a killed run may have left it
    admin(base, f"CREATE DATABASE {database}")
    dsn = with_database(base, database)
    store = PostgresDelayStore(dsn, SCHEMA, "scale-bench")
    spinner = busy_load(args.busy)
    try:
        store.migrate()
        filled = 0
        for rows in sorted(args.rows):
            seconds = fill(dsn, filled, rows)
            filled = rows
            row = measure(store, dsn, rows, args.rounds)
            row["fill_s"] = seconds
            print(json.dumps(row, default=lambda v: round(v, 2)), flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
        store.close()
        admin(base, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
