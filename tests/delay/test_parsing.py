"""Pure logic: deadline formats, header validation, header storage form, settings validation."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from switchyard.core.errors import ConfigError, InvalidNameError
from switchyard.delay.errors import InvalidMessageError
from switchyard.delay.model import DEADLINE_HEADER, MESSAGE_ID_HEADER, DropReason, InputRecord
from switchyard.delay.parsing import (
    format_deadline,
    headers_from_json,
    headers_to_json,
    parse_deadline,
    parse_record,
)
from switchyard.delay.queries import migrations, parse_queries, queries
from switchyard.delay.settings import DelaySettings


@pytest.mark.parametrize(("text", "expected"), [
    ("2022-12-01T11:09:01.123", datetime(2022, 12, 1, 11, 9, 1, 123000, UTC)),  # naive: UTC
    ("2022-12-01T11:09:01Z", datetime(2022, 12, 1, 11, 9, 1, tzinfo=UTC)),
    ("2022-12-01t11:09:01z", datetime(2022, 12, 1, 11, 9, 1, tzinfo=UTC)),
    ("2022-12-01 11:09:01.5+01:00", datetime(2022, 12, 1, 10, 9, 1, 500000, UTC)),
    ("2022-12-01T11:09:01-0230", datetime(2022, 12, 1, 13, 39, 1, tzinfo=UTC)),
    ("2022-12-01T11:09:01+05", datetime(2022, 12, 1, 6, 9, 1, tzinfo=UTC)),
    ("2022-12-01T11:09:01.123456789Z", datetime(2022, 12, 1, 11, 9, 1, 123456, UTC)),
])
def test_accepted_deadline_formats(text: str, expected: datetime) -> None:
    assert parse_deadline(text) == expected


@pytest.mark.parametrize("text", [
    "", "2022-12-01", "2022-12-01T11:09", "1669892941123", "20221201T110901Z", "2022-W48-4T11:09:01Z",
    "2022-13-01T11:09:01Z", "2022-12-01T25:09:01Z", "2022-12-01T11:09:01+24:00", "tomorrow",
    "2022-12-01T11:09:01,5Z",
    "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+00:01",  # valid, but out of range once in UTC
])
def test_rejected_deadline_formats(text: str) -> None:
    with pytest.raises(ValueError):
        parse_deadline(text)


def test_format_deadline_round_trips() -> None:
    d = datetime(2030, 1, 2, 3, 4, 5, 678000, UTC)
    assert format_deadline(d) == "2030-01-02T03:04:05.678Z"
    assert parse_deadline(format_deadline(d)) == d


def _record(*headers: tuple[str, bytes | None]) -> InputRecord:
    return InputRecord("t", 3, 42, b"k", b"v", tuple(headers))


GOOD_ID = (MESSAGE_ID_HEADER, b"m-1")
GOOD_DEADLINE = (DEADLINE_HEADER, b"2030-01-01T00:00:00Z")


def test_parse_record_strips_chronos_headers_and_keeps_the_rest_in_order() -> None:
    m = parse_record(_record(("a", b"1"), GOOD_ID, ("b", None), GOOD_DEADLINE, ("a", b"\x00\xff")))
    assert m.id == "m-1" and m.deadline == datetime(2030, 1, 1, tzinfo=UTC)
    assert m.headers == (("a", b"1"), ("b", None), ("a", b"\x00\xff"))
    assert (m.key, m.value) == (b"k", b"v")


@pytest.mark.parametrize(("headers", "reason"), [
    ((GOOD_DEADLINE,), DropReason.MISSING_MESSAGE_ID),
    ((GOOD_ID,), DropReason.MISSING_DEADLINE),
    ((GOOD_ID, GOOD_ID, GOOD_DEADLINE), DropReason.DUPLICATE_HEADER),
    ((GOOD_ID, GOOD_DEADLINE, GOOD_DEADLINE), DropReason.DUPLICATE_HEADER),
    (((MESSAGE_ID_HEADER, b""), GOOD_DEADLINE), DropReason.INVALID_MESSAGE_ID),
    (((MESSAGE_ID_HEADER, b"x" * 129), GOOD_DEADLINE), DropReason.INVALID_MESSAGE_ID),
    (((MESSAGE_ID_HEADER, b"\xff\xfe"), GOOD_DEADLINE), DropReason.INVALID_MESSAGE_ID),
    (((MESSAGE_ID_HEADER, b"a\x00b"), GOOD_DEADLINE), DropReason.INVALID_MESSAGE_ID),
    ((GOOD_ID, (DEADLINE_HEADER, b"next tuesday")), DropReason.INVALID_DEADLINE),
    ((GOOD_ID, (DEADLINE_HEADER, b"\xff")), DropReason.INVALID_DEADLINE),
    ((GOOD_ID, GOOD_DEADLINE, ("bad\x00name", b"x")), DropReason.INVALID_HEADER_NAME),
    (((MESSAGE_ID_HEADER.lower(), b"m"), GOOD_DEADLINE), DropReason.MISSING_MESSAGE_ID),
])
def test_bad_headers_are_rejected_with_their_reason(headers: tuple, reason: DropReason) -> None:
    with pytest.raises(InvalidMessageError) as info:
        parse_record(_record(*headers))
    assert info.value.reason == reason.value


def test_a_128_character_id_is_accepted() -> None:
    assert parse_record(_record((MESSAGE_ID_HEADER, "é".encode() * 128), GOOD_DEADLINE)).id == "é" * 128


def test_headers_json_keeps_bytes_order_repeats_and_nulls() -> None:
    headers = (("a", b"\x00\x01\xff"), ("b", None), ("a", b""), ("ü", "ü".encode()))
    assert headers_from_json(json.loads(headers_to_json(headers))) == headers


def test_settings_defaults_are_the_seeds() -> None:
    s = DelaySettings()
    assert (s.timing_advance_ms, s.hold_time_ms, s.poll_interval_ms, s.failure_detection_interval_ms) == (
        50, 5000, 100, 500)


@pytest.mark.parametrize("topic", ["", "a b", "x/y", "..", "t" * 250, "in;drop"])
def test_bad_topic_names_are_refused(topic: str) -> None:
    with pytest.raises(InvalidNameError):
        DelaySettings(input_topic=topic)


@pytest.mark.parametrize("schema", ["", "Upper", "a-b", 'x"; drop table y; --', "pg_catalog", "1abc"])
def test_bad_schema_names_are_refused(schema: str) -> None:
    with pytest.raises(InvalidNameError):
        DelaySettings(schema=schema)


def test_settings_refuse_loops_and_hold_times_too_short() -> None:
    with pytest.raises(ConfigError):
        DelaySettings(input_topic="same", output_topic="same")
    with pytest.raises(ConfigError):
        replace(DelaySettings(), hold_time_ms=1000)  # 2 x (50 + 100 + 2000) > 1000
    with pytest.raises(ConfigError):
        DelaySettings(poll_interval_ms=0)


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_DELAY_TIMING_ADVANCE_MS", "7")
    monkeypatch.setenv("SWITCHYARD_DELAY_SCHEMA", "other_schema")
    s = DelaySettings.from_env()
    assert (s.timing_advance_ms, s.schema) == (7, "other_schema")
    monkeypatch.setenv("SWITCHYARD_DELAY_HOLD_TIME_MS", "soon")
    with pytest.raises(ConfigError):
        DelaySettings.from_env()


def test_named_queries_and_migrations_load() -> None:
    assert {"ready_due", "delete_fired", "find_stuck", "reset_stuck", "insert_staged",
            "copy_staging"} <= set(queries())
    assert all("--" not in q for q in queries().values())
    assert [m.version for m in migrations()] == list(range(1, len(migrations()) + 1))
    parsed = parse_queries("-- a --\n-- why\nSELECT 1;\n-- b --\nSELECT 2;")
    assert parsed == {"a": "SELECT 1;", "b": "SELECT 2;"}
