"""``switchyard delay parked`` shows what docs/delay.md and docs/rpc.md say it keeps: each parked
message's headers, key and value (the value cut for a person, whole up to --value-bytes in JSON)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from switchyard.core.config import Connections
from switchyard.delay.model import InputRecord
from switchyard.delay.store import PostgresDelayStore
from tests.conftest import subprocess_env, unique

HEADERS = (("x-switchyard-pool", b"nosuch"), ("x-switchyard-key", b"infra=42"),
           ("x-switchyard-id", b"call-1"), ("traceparent", b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"),
           ("binary", b"\xff\x00"), ("empty", None))
VALUE = b"v" * 300 + b"\xfe"


@pytest.fixture
def parked_schema() -> Iterator[str]:
    """A schema with one record parked by the relay: a call for a pool that does not exist."""
    schema = unique("parked")
    store = PostgresDelayStore(Connections.from_env().postgres_dsn, schema)
    store.migrate()
    try:
        store.park_records([(InputRecord("out", 0, 7, b"infra=42", VALUE, HEADERS), "call-1",
                             "unknown_pool: no pool 'nosuch'")])
        yield schema
    finally:
        store.drop_schema()
        store.close()


def parked(schema: str, *args: str) -> str:
    run = subprocess.run([sys.executable, "-m", "switchyard", "delay", "parked", *args],
                         env=subprocess_env(SWITCHYARD_DELAY_SCHEMA=schema), capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_the_listing_shows_each_messages_headers_key_and_value(parked_schema: str) -> None:
    lines = parked(parked_schema).splitlines()
    assert lines[1].startswith("  call-1  deadline ")
    assert lines[1].endswith("301 bytes  unknown_pool: no pool 'nosuch'")
    assert lines[2] == "    key     infra=42"
    assert lines[3] == "    value   " + "v" * 199 + "…"  # 200 characters for a person
    assert lines[4:] == ["    header  x-switchyard-pool: nosuch", "    header  x-switchyard-key: infra=42",
                         "    header  x-switchyard-id: call-1",
                         f"    header  traceparent: {HEADERS[3][1].decode()}",
                         "    header  binary: \ufffd\\x00", "    header  empty: (null)"]


def test_json_carries_them_exactly(parked_schema: str) -> None:
    (row,) = json.loads(parked(parked_schema, "--json"))
    assert (row["id"], row["bytes"], row["reason"]) == ("call-1", 301, "unknown_pool: no pool 'nosuch'")
    assert row["key"] == {"text": "infra=42", "base64": base64.b64encode(b"infra=42").decode()}
    assert base64.b64decode(row["value"]["base64"]) == VALUE and row["value_truncated"] is False
    assert [(h["name"], None if h["value"] is None else base64.b64decode(h["value"]["base64"]))
            for h in row["headers"]] == list(HEADERS)
    (cut,) = json.loads(parked(parked_schema, "--json", "--value-bytes", "10"))
    assert base64.b64decode(cut["value"]["base64"]) == b"v" * 10 and cut["value_truncated"] is True
