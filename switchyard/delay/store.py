"""Postgres adapter of the DelayStore port: the only module that talks to psycopg.

One autocommit connection per thread (psycopg serialises a shared connection), created lazily and
re-created after the server drops it. An operation that outlasts its deadline has its connection's
socket shut down by a watchdog thread, so a server that went silent without closing the connection
(half-open) costs a StoreUnavailableError and a new connection, not a thread blocked for good. A
connection belongs to its thread: when a thread has ended, its connection is closed the next time
any thread opens one, so threads that come and go (a fire loop's store worker, one per invocation)
never pile up backends. Every driver error leaves here as a StoreError: StoreUnavailableError
(connection lost), TransientStoreError (deadlock, timeouts, overload: retry), UnstorableMessageError
(the data itself was refused), or plain StoreError.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Self, cast

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from switchyard.core.certs import RDS_CA_BUNDLE
from switchyard.core.observability import logger
from switchyard.delay.errors import (
    StoreError,
    StoreUnavailableError,
    TransientStoreError,
    UnstorableMessageError,
)
from switchyard.delay.model import (
    DelayedMessage,
    InputRecord,
    LatenessWindow,
    ParkedMessage,
    ReadyMessage,
    StuckMessage,
)
from switchyard.delay.parsing import headers_from_json, headers_to_json
from switchyard.delay.queries import bind_schema, migrations, schema_queries
from switchyard.delay.settings import libpq_root_cert, validate_schema

_to_json = json.JSONEncoder(separators=(",", ":")).encode

VERIFYING_SSL_MODES = ("verify-ca", "verify-full")
STORE_TIMEOUT_S = 30.0  # the longest one operation may take (DelaySettings.store_timeout_ms)
WATCHDOG_INTERVAL_S = 0.25


def tls_options(dsn: str) -> dict[str, str]:
    """``sslrootcert``: the RDS CA bundle shipped with the package, when ``dsn`` asks libpq to verify the
    server and names no root certificate of its own (libpq's default, ~/.postgresql/root.crt, exists on
    no Lambda or worker host). A DSN or PGSSLROOTCERT that names one keeps it."""
    params = conninfo_to_dict(dsn)
    named = "sslrootcert" in params or libpq_root_cert()
    if params.get("sslmode") in VERIFYING_SSL_MODES and not named:
        return {"sslrootcert": str(RDS_CA_BUNDLE)}
    return {}


class PostgresDelayStore:
    """Delayed messages in ``{schema}.delayed_messages``."""

    def __init__(self, dsn: str, schema: str, application_name: str = "switchyard-delay",
                 timeout_s: float = STORE_TIMEOUT_S) -> None:
        self.dsn = dsn
        self.schema = validate_schema(schema)
        self.application_name = application_name
        self._q = schema_queries(self.schema)
        # One channel per schema; hashed because a channel name is an identifier of at most 63 bytes.
        self.channel = "switchyard_delay_" + hashlib.sha256(self.schema.encode()).hexdigest()[:16]
        self._local = threading.local()
        self._owners: dict[psycopg.Connection, threading.Thread] = {}
        self._owners_lock = threading.Lock()
        self.timeout_s = timeout_s
        self._deadlines: dict[psycopg.Connection, float] = {}  # operations under way (monotonic)
        self._watchdog: threading.Thread | None = None
        self._closed = threading.Event()

    # -- connections -------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            self._close_orphans()
            conn = psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=5, application_name=self.application_name,
                **cast("dict[str, Any]", tls_options(self.dsn)),  # libpq keywords, as strings
            )
            self._local.conn = conn
            with self._owners_lock:
                self._owners[conn] = threading.current_thread()
        return conn

    def _close_orphans(self) -> None:
        """Close the connections of threads that have ended (nobody else may use them)."""
        with self._owners_lock:
            orphans = [c for c, thread in self._owners.items() if not thread.is_alive()]
            for conn in orphans:
                del self._owners[conn]
        for conn in orphans:
            conn.close()

    def _discard(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with self._owners_lock:
                self._owners.pop(conn, None)
            conn.close()

    @contextmanager
    def _session(self, wait_s: float = 0.0) -> Iterator[psycopg.Connection]:
        """A connection for one operation (which may also wait ``wait_s`` on purpose), dropped by the
        watchdog past its deadline; driver errors become the StoreError they mean."""
        conn: psycopg.Connection | None = None
        try:
            conn = self._connection()
            self._watch(conn, time.monotonic() + self.timeout_s + wait_s)
            yield conn
        except psycopg.Error as exc:
            lost = conn is None or conn.broken or conn.closed or isinstance(exc, psycopg.InterfaceError)
            if lost or (conn is not None
                        and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE):
                self._discard()
            detail = str(exc).strip()
            if lost:
                raise StoreUnavailableError(f"postgres unavailable: {detail}") from exc
            if isinstance(exc, psycopg.OperationalError):  # deadlock, serialization, timeouts, resources
                raise TransientStoreError(f"postgres transient error: {detail}") from exc
            if isinstance(exc, psycopg.DataError | psycopg.IntegrityError):
                raise UnstorableMessageError(f"postgres refused the data: {detail}") from exc
            raise StoreError(f"postgres error: {detail}") from exc
        finally:
            if conn is not None:
                with self._owners_lock:
                    self._deadlines.pop(conn, None)

    def _watch(self, conn: psycopg.Connection, deadline: float) -> None:
        with self._owners_lock:
            self._deadlines[conn] = deadline
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch_loop, daemon=True,
                                                  name=f"delay-store-watchdog-{self.schema}")
                self._watchdog.start()

    def _watch_loop(self) -> None:
        """Shut down the socket of each operation past its deadline: the blocked read then fails."""
        while not self._closed.wait(WATCHDOG_INTERVAL_S):
            now = time.monotonic()
            with self._owners_lock:
                late = [conn for conn, deadline in self._deadlines.items() if deadline < now]
                for conn in late:
                    del self._deadlines[conn]
            for conn in late:
                logger.warning("postgres operation past its deadline: dropping the connection",
                               extra={"timeout_s": self.timeout_s, "schema": self.schema})
                try:
                    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
                        sock.shutdown(socket.SHUT_RDWR)
                except (OSError, psycopg.Error):
                    pass  # closed meanwhile: the operation ended anyway

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection this store opened, in any thread (a store left open keeps them:
        its watchdog thread holds it)."""
        self._closed.set()
        with self._owners_lock:
            conns, self._owners = list(self._owners), {}
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
                try:
                    with cur.copy(self._q["copy_staging"]) as copy:
                        write = copy.write_row
                        for m in messages:
                            write((m.id, m.deadline, m.key, m.value, headers_to_json(m.headers)))
                except UnicodeError as exc:  # a str psycopg cannot encode (rolled back with the COPY)
                    raise UnstorableMessageError(f"cannot encode a message for postgres: {exc}") from exc
                cur.execute(self._q["insert_staged"])
                inserted = {row[0] for row in cur.fetchall()}
                cur.execute(self._q["notify_enqueued"], {"channel": self.channel})
                return inserted

    def next_deadline(self) -> datetime | None:
        """The earliest deadline of a waiting row, or None when nothing waits."""
        with self._session() as conn:
            row = conn.execute(self._q["next_deadline"]).fetchone()
        return row[0] if row else None

    def overdue(self, before: datetime) -> int:
        """Waiting, unclaimed rows due before ``before`` (at most 100,000)."""
        with self._session() as conn:
            row = conn.execute(self._q["count_overdue"], {"before": before}).fetchone()
        return int(row[0]) if row else 0

    def wait_enqueued(self, timeout_s: float) -> float | None:
        """Wait up to ``timeout_s`` for enqueue notifications; the earliest deadline notified (epoch s).

        Listens on this thread's connection (keep it for listening only). A new LISTEN returns 0.0
        at once: whatever was enqueued before it was not notified to us, so the caller claims now.
        """
        with self._session(wait_s=timeout_s) as conn:
            if not getattr(conn, "_switchyard_listening", False):
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                conn._switchyard_listening = True  # type: ignore[attr-defined]
                return 0.0
            payloads = [n.payload for n in conn.notifies(timeout=timeout_s, stop_after=1)]
            if payloads:  # take whatever else is already queued without waiting again
                payloads += [n.payload for n in conn.notifies(timeout=0)]
        due = [float(p) for p in payloads if p]
        return min(due) if due else None

    def stop_listening(self) -> None:
        """Close this thread's (listening) connection: a fire invocation's listener ends with it."""
        self._discard()

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

    def park(self, node_id: str, refused: Sequence[tuple[ReadyMessage, str]]) -> set[str]:
        """Move rows the broker refused for good to ``parked_messages``; returns the ids moved."""
        if not refused:
            return set()
        params = {
            "ids": [m.id for m, _ in refused],
            "seqs": [m.seq for m, _ in refused],
            "readied_ats": [m.readied_at for m, _ in refused],
            "reasons": [reason for _, reason in refused],
            "node": uuid.UUID(node_id),
        }
        with self._session() as conn:
            return {row[0] for row in conn.execute(self._q["park_refused"], params)}

    def park_records(self, records: Sequence[tuple[InputRecord, str, str]]) -> None:
        """Set aside ``(record, id, reason)`` triples in ``parked_messages`` (``seq``: the record's
        offset), as they came: for a person to read (``switchyard delay parked``) and replay."""
        if not records:
            return
        params = {
            "ids": [message_id for _, message_id, _ in records],
            "seqs": [record.offset for record, _, _ in records],
            "headers": [headers_to_json(record.headers) for record, _, _ in records],
            "keys": [record.key for record, _, _ in records],
            "values": [record.value for record, _, _ in records],
            "reasons": [reason for _, _, reason in records],
        }
        with self._session() as conn:
            conn.execute(self._q["park_records"], params)

    def parked(self, limit: int = 100, value_bytes: int = 1024) -> list[ParkedMessage]:
        """The parked messages, newest first, each value cut to its first ``value_bytes``."""
        with self._session() as conn:
            rows = conn.execute(self._q["parked"], {"limit": limit, "value_bytes": value_bytes}).fetchall()
        return [ParkedMessage(message_id, deadline, parked_at, reason, size,
                              None if key is None else bytes(key), None if value is None else bytes(value),
                              headers_from_json(headers))
                for message_id, deadline, parked_at, reason, size, key, value, headers in rows]

    def parked_count(self) -> int:
        with self._session() as conn:
            row = conn.execute(self._q["parked_count"]).fetchone()
        return int(row[0]) if row else 0

    def replay_parked(self, ids: Sequence[str] | None, limit: int) -> list[str]:
        """Move parked messages (``ids``, or all when None; the oldest ``limit``) back to waiting,
        due now, once their cause is fixed; returns the ids moved. An id waiting again under a new
        message stays parked (replaying it would drop one of the two)."""
        params = {"all": ids is None, "ids": list(ids or ()), "limit": limit}
        with self._session() as conn, conn.transaction():
            moved = sorted(row[0] for row in conn.execute(self._q["replay_parked"], params))
            if moved:
                conn.execute(self._q["notify_replayed"], {"channel": self.channel})
        return moved

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

    def record_lateness(self, node_id: str, window: LatenessWindow) -> None:
        """Keep one fire loop's lateness window (an hour of them is kept) for the status view."""
        params = {"node": uuid.UUID(node_id), "fired": window.fired, "p50_ms": window.p50_ms,
                  "p99_ms": window.p99_ms, "max_ms": window.max_ms}
        with self._session() as conn:
            conn.execute(self._q["record_lateness"], params)

    def lateness(self, since: datetime) -> list[tuple[float, LatenessWindow]]:
        """``(epoch s, window)`` of every node's windows recorded since ``since``, oldest first."""
        with self._session() as conn:
            rows = conn.execute(self._q["lateness"], {"since": since}).fetchall()
        return [(r[0], LatenessWindow(r[1], r[2], r[3], r[4])) for r in rows]

    def status_figures(self, before: datetime) -> tuple[int, int, int, int, datetime | None]:
        """``(waiting, ready, overdue before `before`, parked, earliest waiting deadline)``."""
        with self._session() as conn:
            row = conn.execute(self._q["status_figures"], {"before": before}).fetchone()
        assert row is not None  # one row of scalar subqueries, always
        return row[0], row[1], row[2], row[3], row[4]

    def counts(self) -> tuple[int, int]:
        """(waiting, ready) row counts."""
        with self._session() as conn:
            row = conn.execute(self._q["counts"]).fetchone()
        return (row[0], row[1]) if row else (0, 0)
