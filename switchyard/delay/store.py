"""Postgres adapter of the DelayStore port: the only module that talks to psycopg.

One autocommit connection per thread (psycopg serialises a shared connection), created lazily and
re-created after the server drops it. Every driver error leaves here as a StoreError.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta

import psycopg

from switchyard.delay.errors import StoreError, StoreUnavailableError
from switchyard.delay.model import DelayedMessage, ReadyMessage, StuckMessage
from switchyard.delay.parsing import headers_from_json, headers_to_json
from switchyard.delay.queries import bind_schema, migrations, schema_queries
from switchyard.delay.settings import validate_schema
from switchyard.observability import logger

_to_json = json.JSONEncoder(separators=(",", ":")).encode


class PostgresDelayStore:
    """Delayed messages in ``{schema}.delayed_messages``."""

    def __init__(self, dsn: str, schema: str, application_name: str = "switchyard-delay") -> None:
        self.dsn = dsn
        self.schema = validate_schema(schema)
        self.application_name = application_name
        self._q = schema_queries(self.schema)
        self._local = threading.local()
        self._all: list[psycopg.Connection] = []
        self._all_lock = threading.Lock()

    # -- connections -------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=5, application_name=self.application_name
            )
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _discard(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    @contextmanager
    def _session(self) -> Iterator[psycopg.Connection]:
        """A connection for one operation; driver errors become StoreError / StoreUnavailableError."""
        try:
            conn = self._connection()
            yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self._discard()
            raise StoreUnavailableError(f"postgres unavailable: {exc}".strip()) from exc
        except psycopg.Error as exc:
            conn = getattr(self._local, "conn", None)
            if conn is not None and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                self._discard()
            raise StoreError(f"postgres error: {exc}".strip()) from exc

    def close(self) -> None:
        """Close every connection this store opened, in any thread."""
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()

    # -- schema ------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply the migrations not yet applied, under an advisory lock; returns the versions applied."""
        applied_now: list[int] = []
        with self._session() as conn, conn.transaction():
            conn.execute(self._q["lock_migrations"], {"schema": self.schema})
            conn.execute(self._q["create_schema"])
            done = {row[0] for row in conn.execute(self._q["applied_migrations"])}
            for mig in migrations():
                if mig.version in done:
                    continue
                conn.execute(bind_schema(mig.text, self.schema))
                conn.execute(self._q["record_migration"], {"version": mig.version, "name": mig.name})
                applied_now.append(mig.version)
        if applied_now:
            logger.info("delay schema migrated", extra={"schema": self.schema, "versions": applied_now})
        return applied_now

    def drop_schema(self) -> None:
        """Drop the whole schema (tests and benchmarks clean up with this)."""
        with self._session() as conn:
            conn.execute(bind_schema("DROP SCHEMA IF EXISTS {schema} CASCADE", self.schema))

    # -- the port ----------------------------------------------------------------------------

    def existing_ids(self, ids: Sequence[str]) -> set[str]:
        if not ids:
            return set()
        with self._session() as conn:
            return {row[0] for row in conn.execute(self._q["existing_ids"], {"ids": list(ids)})}

    def insert(self, messages: Sequence[DelayedMessage]) -> set[str]:
        """One transaction: binary COPY into a session temp table, then INSERT ... ON CONFLICT DO NOTHING.

        COPY's rows are encoded in C; the array parameters of a single INSERT were encoded in Python
        (psycopg's list dumper), which was the largest cost of enqueuing. Values are dumped by their
        Python type (str, aware datetime, bytes or None: exactly the staging columns' binary forms);
        ``set_types`` would pick psycopg's pure-Python bytea dumper.
        """
        if not messages:
            return set()
        with self._session() as conn:
            if not getattr(conn, "_switchyard_staging", False):
                conn.execute(self._q["create_staging"])
                conn._switchyard_staging = True  # type: ignore[attr-defined]
            with conn.transaction(), conn.cursor() as cur:
                with cur.copy(self._q["copy_staging"]) as copy:
                    write = copy.write_row
                    for m in messages:
                        write((m.id, m.deadline, m.key, m.value, headers_to_json(m.headers)))
                cur.execute(self._q["insert_staged"])
                return {row[0] for row in cur.fetchall()}

    def ready(self, node_id: str, horizon: timedelta, limit: int) -> list[ReadyMessage]:
        params = {"node": uuid.UUID(node_id), "horizon": horizon, "limit": limit}
        with self._session() as conn:
            rows = conn.execute(self._q["ready_due"], params).fetchall()
        # Headers come as jsonb's text: most messages have none ("[]"), and json.loads is faster
        # than psycopg's jsonb loader for the rest.
        return [
            ReadyMessage(r[0], r[1], r[2], r[3], r[4], r[5],
                         () if r[6] == "[]" else headers_from_json(json.loads(r[6])))
            for r in rows
        ]

    def delete(self, messages: Sequence[ReadyMessage]) -> set[str]:
        if not messages:
            return set()
        pairs = _to_json([(m.id, m.seq) for m in messages])
        with self._session() as conn:
            return {row[0] for row in conn.execute(self._q["delete_fired"], {"pairs": pairs})}

    def release(self, node_id: str, messages: Sequence[ReadyMessage]) -> set[str]:
        if not messages:
            return set()
        params = {
            "ids": [m.id for m in messages],
            "seqs": [m.seq for m in messages],
            "readied_ats": [m.readied_at for m in messages],
            "node": uuid.UUID(node_id),
        }
        with self._session() as conn:
            return {row[0] for row in conn.execute(self._q["release_unfired"], params)}

    def find_stuck(self, hold: timedelta, limit: int) -> list[StuckMessage]:
        with self._session() as conn:
            rows = conn.execute(self._q["find_stuck"], {"hold": hold, "limit": limit}).fetchall()
        return [StuckMessage(id=r[0], readied_at=r[1], readied_by=r[2]) for r in rows]

    def reset_stuck(self, stuck: Sequence[StuckMessage]) -> list[StuckMessage]:
        if not stuck:
            return []
        params = {
            "ids": [s.id for s in stuck],
            "readied_ats": [s.readied_at for s in stuck],
            "readied_bys": [s.readied_by for s in stuck],
        }
        by_id = {s.id: s for s in stuck}
        with self._session() as conn:
            return [by_id[row[0]] for row in conn.execute(self._q["reset_stuck"], params)]

    def counts(self) -> tuple[int, int]:
        """(waiting, ready) row counts."""
        with self._session() as conn:
            row = conn.execute(self._q["counts"]).fetchone()
        return (row[0], row[1]) if row else (0, 0)
