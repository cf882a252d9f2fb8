"""The pipeline's row rules alone (no Spark, no services): validation, stable ids, outcomes."""

from __future__ import annotations

from concurrent.futures import Future
from datetime import UTC, datetime

import pytest

from switchyard.core.errors import BrokerUnavailableError
from switchyard.rpc import protocol as p
from switchyard.rpc.client import Response
from switchyard.rpc.errors import CallTimeoutError
from switchyard.spark import rows as r
from switchyard.spark.calls import _outcome


def test_a_valid_row_keeps_its_id_pool_and_body_and_gets_a_canonical_deadline() -> None:
    req = r.prepare({"key": "k", "body": b"\x00\xff", "pool": "p1", "id": "x",
                     "deadline": "2030-01-02 03:04:05+01:00"}, "default")
    assert req == r.Request("x", "p1", "k", b"\x00\xff", "2030-01-02T02:04:05.000Z")


def test_ids_are_stable_and_depend_on_what_is_sent() -> None:
    a = r.prepare({"key": "k", "body": "b"}, "p1")
    assert a.id == r.prepare({"key": "k", "body": b"b"}, "p1").id == r.stable_id("p1", "k", b"b", None)
    others = [r.prepare(row, "p1").id for row in (
        {"key": "k", "body": "c"}, {"key": "j", "body": "b"}, {"key": "k", "body": "b", "pool": "p2"},
        {"key": "k", "body": "b", "deadline": "2030-01-01T00:00:00Z"})]
    assert len({a.id, *others}) == 5 and len(a.id) == r.ID_HEX_CHARS


def test_naive_datetimes_are_utc() -> None:
    req = r.prepare({"key": "k", "deadline": datetime(2030, 1, 1, 12)}, "p")
    aware = r.prepare({"key": "k", "deadline": datetime(2030, 1, 1, 12, tzinfo=UTC)}, "p")
    assert req.deadline == aware.deadline == "2030-01-01T12:00:00.000Z"


@pytest.mark.parametrize(("row", "default_pool", "reason"), [
    ({"body": "x"}, "p", r.Reason.MISSING_KEY),
    ({"key": "a\x00b"}, "p", r.Reason.INVALID_KEY),
    ({"key": "k" * (p.MAX_KEY_BYTES + 1)}, "p", r.Reason.INVALID_KEY),
    ({"key": "k"}, None, r.Reason.MISSING_POOL),
    ({"key": "k", "pool": "a-b"}, None, r.Reason.INVALID_POOL),
    ({"key": "k", "body": 12}, "p", r.Reason.INVALID_BODY),
    ({"key": "k", "deadline": "2030-01-01"}, "p", r.Reason.INVALID_DEADLINE),
    ({"key": "k", "id": ""}, "p", r.Reason.INVALID_ID),
    ({"key": "k", "id": "i" * 129}, "p", r.Reason.INVALID_ID),
])
def test_bad_rows_are_rejected_with_a_reason(row: dict, default_pool: str | None, reason: r.Reason) -> None:
    rejected = r.prepare(row, default_pool)
    assert isinstance(rejected, r.Rejected) and rejected.reason is reason and rejected.detail
    assert r.error_row(rejected)[3] == reason.value


def test_an_empty_key_is_a_key() -> None:
    assert isinstance(r.prepare({"key": ""}, "p"), r.Request)


def finished(value: object) -> Future:
    future: Future = Future()
    if isinstance(value, Exception):
        future.set_exception(value)
    else:
        future.set_result(value)
    return future


@pytest.mark.parametrize(("value", "status", "retry"), [
    (Response(p.Status.OK, b"hi", "c"), r.Status.OK, False),
    (Response(p.Status.ERROR, b"boom", "c"), r.Status.ERROR, False),
    (Response(p.Status.DELIVERY_LIMIT, b"", "c"), r.Status.DELIVERY_LIMIT, False),
    (Response(p.Status.EXPIRED, b"", "c"), r.Status.EXPIRED, True),
    (Response(p.Status.MAXLEN, b"", "c"), r.Status.MAXLEN, True),
    (CallTimeoutError("late"), r.Status.TIMEOUT, True),
    (BrokerUnavailableError("gone"), r.Status.FAILED, True),
])
def test_outcomes_final_or_retried(value: object, status: r.Status, retry: bool) -> None:
    got = _outcome(finished(value))
    assert (got[0], got[3]) == (status, retry)
    assert (got[0] in r.FINAL_STATUSES) is (not retry)
