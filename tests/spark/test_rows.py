"""The pipeline's row rules alone (no Spark, no services): validation, stable ids, outcomes."""

from __future__ import annotations

from concurrent.futures import Future
from datetime import UTC, datetime

import pytest

from switchyard.core.errors import BrokerUnavailableError
from switchyard.rpc import protocol
from switchyard.rpc.client import Response
from switchyard.rpc.errors import CallTimeoutError
from switchyard.spark import rows
from switchyard.spark.calls import _outcome


def test_a_valid_row_keeps_its_id_pool_and_body_and_gets_a_canonical_deadline() -> None:
    req = rows.prepare({"key": "k", "body": b"\x00\xff", "pool": "p1", "id": "x",
                        "deadline": "2030-01-02 03:04:05+01:00"}, "default")
    assert req == rows.Request("x", "p1", "k", b"\x00\xff", "2030-01-02T02:04:05.000Z")


def test_ids_are_stable_and_depend_on_what_is_sent() -> None:
    a = rows.prepare({"key": "k", "body": "b"}, "p1")
    assert a.id == rows.prepare({"key": "k", "body": b"b"}, "p1").id == rows.stable_id("p1", "k", b"b", None)
    others = [rows.prepare(row, "p1").id for row in (
        {"key": "k", "body": "c"}, {"key": "j", "body": "b"}, {"key": "k", "body": "b", "pool": "p2"},
        {"key": "k", "body": "b", "deadline": "2030-01-01T00:00:00Z"})]
    assert len({a.id, *others}) == 5 and len(a.id) == rows.ID_HEX_CHARS


def test_naive_datetimes_are_utc() -> None:
    req = rows.prepare({"key": "k", "deadline": datetime(2030, 1, 1, 12)}, "p")
    aware = rows.prepare({"key": "k", "deadline": datetime(2030, 1, 1, 12, tzinfo=UTC)}, "p")
    assert req.deadline == aware.deadline == "2030-01-01T12:00:00.000Z"


@pytest.mark.parametrize(("row", "default_pool", "reason"), [
    ({"body": "x"}, "p", rows.Reason.MISSING_KEY),
    ({"key": "a\x00b"}, "p", rows.Reason.INVALID_KEY),
    ({"key": "k" * (protocol.MAX_KEY_BYTES + 1)}, "p", rows.Reason.INVALID_KEY),
    ({"key": "k"}, None, rows.Reason.MISSING_POOL),
    ({"key": "k", "pool": "a-b"}, None, rows.Reason.INVALID_POOL),
    ({"key": "k", "body": 12}, "p", rows.Reason.INVALID_BODY),
    ({"key": "k", "deadline": "2030-01-01"}, "p", rows.Reason.INVALID_DEADLINE),
    ({"key": "k", "id": ""}, "p", rows.Reason.INVALID_ID),
    ({"key": "k", "id": "i" * 129}, "p", rows.Reason.INVALID_ID),
    ({"key": "k", "id": "\U0001f600" * 100}, "p", rows.Reason.INVALID_ID),  # 400 bytes: no AMQP message id
])
def test_bad_rows_are_rejected_with_a_reason(row: dict, default_pool: str | None,
                                             reason: rows.Reason) -> None:
    rejected = rows.prepare(row, default_pool)
    assert isinstance(rejected, rows.Rejected) and rejected.reason is reason and rejected.detail
    assert rows.error_row(rejected)[3] == reason.value


def test_an_empty_key_is_a_key() -> None:
    assert isinstance(rows.prepare({"key": ""}, "p"), rows.Request)


def finished(value: object) -> Future:
    future: Future = Future()
    if isinstance(value, Exception):
        future.set_exception(value)
    else:
        future.set_result(value)
    return future


@pytest.mark.parametrize(("value", "status", "retry"), [
    (Response(protocol.Status.OK, b"hi", "c"), rows.Status.OK, False),
    (Response(protocol.Status.ERROR, b"boom", "c"), rows.Status.ERROR, False),
    (Response(protocol.Status.DELIVERY_LIMIT, b"", "c"), rows.Status.DELIVERY_LIMIT, False),
    (Response(protocol.Status.EXPIRED, b"", "c"), rows.Status.EXPIRED, True),
    (Response(protocol.Status.MAXLEN, b"", "c"), rows.Status.MAXLEN, True),
    (CallTimeoutError("late"), rows.Status.TIMEOUT, True),
    (BrokerUnavailableError("gone"), rows.Status.FAILED, True),
])
def test_outcomes_final_or_retried(value: object, status: rows.Status, retry: bool) -> None:
    got = _outcome(finished(value))
    assert (got[0], got[3]) == (status, retry)
    assert (got[0] in rows.FINAL_STATUSES) is (not retry)


def test_a_rejected_row_says_where_it_came_from_and_a_request_keeps_its_origin() -> None:
    bad = rows.located(rows.prepare({"body": "x"}, "p"), "/in/rows.jsonl", 7)
    assert isinstance(bad, rows.Rejected)
    assert (rows.error_row(bad)[-2:] == ("/in/rows.jsonl", 7)
            and len(rows.error_row(bad)) == len(rows.ERROR_FIELDS))
    good = rows.located(rows.prepare({"key": "k", "id": "i"}, "p"), "/in/rows.jsonl", 8)
    assert isinstance(good, rows.Request) and good == rows.Request("i", "p", "k", b"", None)
    later = rows.rejected_later(good, rows.Reason.UNKNOWN_POOL, "no pool p")
    assert rows.error_row(later) == ("i", "p", "k", "unknown_pool", "no pool p", "/in/rows.jsonl", 8)


@pytest.mark.parametrize(("uri", "local", "given", "shown"), [
    ("file:///tmp/in/rows%20a.jsonl", None, None, "/tmp/in/rows a.jsonl"),
    ("file:///tmp/x/input/sub/rows.csv", "/tmp/x/input", "s3://b/in/", "s3://b/in/sub/rows.csv"),
    ("file:///tmp/x/input/rows.csv", "/tmp/x/input/rows.csv", "s3://b/in/rows.csv", "s3://b/in/rows.csv"),
    ("hdfs://n/rows.csv", None, None, "hdfs://n/rows.csv"),
])
def test_input_files_are_named_as_given(uri: str, local: str | None, given: str | None, shown: str) -> None:
    assert rows.shown_input_file(uri, local, given) == shown


def test_every_output_column_is_documented_and_the_json_response_is_said_to_be_base64() -> None:
    assert set(rows.RESULT_COLUMNS) == {*rows.RESULT_FIELDS, "run_id"}
    assert set(rows.ERROR_COLUMNS) == {*rows.ERROR_FIELDS, "run_id"}
    assert "base64" in rows.RESULT_COLUMNS["response"] and "base64" in rows.FORMAT_HELP


def test_a_row_is_sent_in_its_trace_or_a_new_one() -> None:
    from switchyard.core import tracing
    from switchyard.spark.schedule import chronos_headers

    given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = rows.prepare({"key": "k", "traceparent": given, "deadline": "2030-01-01T00:00:00Z"}, "p")
    sent = tracing.parse(traced.traceparent)
    assert sent.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and sent.span_id != "00f067aa0ba902b7"
    assert (tracing.TRACEPARENT_HEADER, traced.traceparent.encode()) in chronos_headers(traced)
    # not in the id
    assert traced.id == rows.prepare({"key": "k", "deadline": "2030-01-01T00:00:00Z"}, "p").id
    for value in (None, "", "nonsense", given.upper()):
        fresh = rows.prepare({"key": "k", "traceparent": value}, "p")
        assert isinstance(fresh, rows.Request) and tracing.parse(fresh.traceparent)
        assert tracing.parse(fresh.traceparent).trace_id != sent.trace_id
