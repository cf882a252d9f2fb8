"""The pipeline's rows, without Spark: input validation, stable ids, output statuses and columns.

Pure functions, so the rules are tested alone and run the same in every Spark task.
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from urllib.parse import unquote, urlparse

from switchyard.core import tracing
from switchyard.core.errors import InvalidNameError
from switchyard.delay.parsing import format_deadline, parse_deadline
from switchyard.rpc import protocol
from switchyard.rpc.scheduling import validate_call_id

# Input columns (every one but ``key`` optional). ``traceparent``: the row's W3C trace context, the
# header of its RPC request or its delay record (a new trace when absent or malformed).
KEY, BODY, POOL, ID, DEADLINE = "key", "body", "pool", "id", "deadline"
TRACEPARENT = tracing.TRACEPARENT_HEADER
INPUT_COLUMNS = (KEY, BODY, POOL, ID, DEADLINE, TRACEPARENT)

ID_HEX_CHARS = 32  # 128 bits of SHA-256: a stable id per distinct row


class Status(StrEnum):
    """A row's ``status`` in the results output."""

    OK = "ok"  # the worker answered
    ERROR = "error"  # the worker's handler failed (a negative answer: final, not retried)
    DELIVERY_LIMIT = "delivery_limit"  # poison: the broker dead-lettered it after too many deliveries
    REJECTED = "rejected"  # dead-lettered: rejected without requeue
    SCHEDULED = "scheduled"  # produced to the delay scheduler's input topic, confirmed
    SENT = "sent"  # --no-reply: published without reply-to, confirmed by the broker
    TIMEOUT = "timeout"  # no answer within --timeout, after every retry
    EXPIRED = "expired"  # dead-lettered unanswered (TTL), after every retry
    MAXLEN = "maxlen"  # dead-lettered: the queue was full, after every retry
    FAILED = "failed"  # the broker lost or refused it, after every retry


# What --resume never sends again. The others may succeed on a later run.
FINAL_STATUSES = frozenset({Status.OK, Status.ERROR, Status.DELIVERY_LIMIT, Status.REJECTED,
                            Status.SCHEDULED, Status.SENT})


class Reason(StrEnum):
    """Why a row went to the ``errors`` output instead of being sent."""

    MISSING_KEY = "missing_key"
    INVALID_KEY = "invalid_key"  # one the protocol cannot carry (NUL, longer than MAX_KEY_BYTES)
    INVALID_BODY = "invalid_body"  # neither a string nor bytes
    MISSING_POOL = "missing_pool"  # no pool column value and no --pool
    INVALID_POOL = "invalid_pool"  # not a pool name
    UNKNOWN_POOL = "unknown_pool"  # a valid name, but no such pool on the broker
    INVALID_ID = "invalid_id"  # empty, over 128 characters, or with NUL (Chronos' limits)
    INVALID_DEADLINE = "invalid_deadline"  # not an accepted ISO-8601 date-time


@dataclass(frozen=True, slots=True)
class Request:
    """A valid row: what is sent (``deadline`` None: called now; else scheduled)."""

    id: str
    pool: str
    key: str
    body: bytes
    deadline: str | None  # canonical UTC form (format_deadline)
    # (input file, data row from 1): where it came from, for an errors row if it is rejected later
    origin: tuple[str | None, int | None] = field(default=(None, None), compare=False)
    traceparent: str = field(default="", compare=False)  # what it is sent with ("": none)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A bad row: what could be read of it, and why it is not sent."""

    id: str | None
    pool: str | None
    key: str | None
    reason: Reason
    detail: str
    input_file: str | None = None  # the input file the row came from (as given: s3:// stays s3://)
    input_row: int | None = None  # its data row in that file, from 1 (JSON Lines: the line)


def stable_id(pool: str, key: str, body: bytes, deadline: str | None) -> str:
    """The id of a row without one: a hash of what it sends, so a re-run sends the same ids."""
    material = json.dumps([pool, key, base64.b64encode(body).decode("ascii"), deadline],
                          separators=(",", ":"))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:ID_HEX_CHARS]


def prepare(row: dict[str, Any], default_pool: str | None) -> Request | Rejected:
    """Validate one input row (column name -> value; missing columns are None)."""
    key, raw_id = row.get(KEY), row.get(ID)
    pool = row.get(POOL) or default_pool
    given_id = None if raw_id is None else str(raw_id)
    key_text = None if key is None else str(key)

    def reject(reason: Reason, detail: str) -> Rejected:
        return Rejected(given_id, pool, key_text, reason, detail)

    if key_text is None:  # None exactly when key is
        return reject(Reason.MISSING_KEY, "the row has no key")
    try:
        protocol.validate_key(key_text)
    except InvalidNameError as exc:
        return reject(Reason.INVALID_KEY, str(exc))
    if pool is None:
        return reject(Reason.MISSING_POOL, "the row has no pool and no --pool was given")
    try:
        protocol.validate_pool(pool)
    except InvalidNameError as exc:
        return reject(Reason.INVALID_POOL, str(exc))
    try:
        body = protocol.body_bytes(row.get(BODY), "body must be a string or bytes")
    except TypeError as exc:
        return reject(Reason.INVALID_BODY, str(exc))
    deadline = row.get(DEADLINE)
    if deadline is not None:
        try:
            if isinstance(deadline, datetime):  # naive means UTC, as for the delay scheduler's strings
                parsed = deadline if deadline.tzinfo else deadline.replace(tzinfo=UTC)
            else:
                parsed = parse_deadline(str(deadline))
            deadline = format_deadline(parsed)
        except ValueError as exc:
            return reject(Reason.INVALID_DEADLINE, str(exc))
    if given_id is not None:
        try:
            validate_call_id(given_id)  # the delay's message id, AMQP's message and correlation id
        except InvalidNameError as exc:
            return reject(Reason.INVALID_ID, str(exc))
    row_id = given_id if given_id is not None else stable_id(pool, key_text, body, deadline)
    trace = tracing.continue_from(row.get(TRACEPARENT))  # the publish is a hop of the row's trace
    return Request(row_id, pool, key_text, body, deadline, traceparent=trace.traceparent)


def result_row(request: Request, status: Status | str, attempts: int, latency_ms: float | None,
               response: bytes | None = None, error: str | None = None) -> tuple:
    """One results row, in ``RESULT_FIELDS`` order."""
    return (request.id, request.pool, request.key, str(status), attempts, latency_ms, response, error,
            request.deadline)


RESULT_FIELDS = ("id", "pool", "key", "status", "attempts", "latency_ms", "response", "error", "deadline")
ERROR_FIELDS = ("id", "pool", "key", "reason", "detail", "input_file", "input_row")

# What each output column holds: the job's module docstring, its --help and the columns' comments
# (Parquet keeps them in its schema) say the same, from here.
RESULT_COLUMNS: dict[str, str] = {
    "id": "the row's id (its id column, else a hash of pool, key, body and deadline)",
    "pool": "the pool it was sent to",
    "key": "its key",
    "status": "ok, error, delivery_limit, rejected, scheduled, sent (final); timeout, expired, maxlen, "
              "failed (not final: --resume sends them again)",
    "attempts": "calls made (1 + retries)",
    "latency_ms": "to the answer (or, --no-reply, to the broker's confirm)",
    "response": "the worker's answer as bytes: binary in Parquet, a base64 string in --format json "
                "(decode it: base64.b64decode(row['response']))",
    "error": "why it did not end ok",
    "deadline": "a scheduled row's deadline (ISO-8601 UTC), else null",
    "run_id": "the run that wrote it",
}
ERROR_COLUMNS: dict[str, str] = {
    "id": "the row's id column, null when it has none (unknown_pool: the id it would have been sent with)",
    "pool": "its pool (or --pool)",
    "key": "its key",
    "reason": "why it was not sent: " + ", ".join(reason.value for reason in Reason),
    "detail": "the reason in words",
    "input_file": "the input file it came from",
    "input_row": "its data row in that file, from 1 (JSON Lines: the line number; CSV: the line after "
                 "the header; Parquet: the row's position)",
    "run_id": "the run that wrote it",
}
FORMAT_HELP = ("output format: parquet (default) or json (JSON Lines; the results' response column, "
               "bytes, is then a base64 string)")


def error_row(rejected: Rejected) -> tuple:
    """One errors row, in ``ERROR_FIELDS`` order."""
    return (rejected.id, rejected.pool, rejected.key, str(rejected.reason), rejected.detail,
            rejected.input_file, rejected.input_row)


def located(outcome: Request | Rejected, input_file: str | None, input_row: int | None) -> Request | Rejected:
    """The row with where it came from (an errors row must say which input row failed)."""
    if isinstance(outcome, Rejected):
        return replace(outcome, input_file=input_file, input_row=input_row)
    return replace(outcome, origin=(input_file, input_row))


def rejected_later(request: Request, reason: Reason, detail: str) -> Rejected:
    """A valid row rejected after preparing (its pool is not on the broker), keeping its origin."""
    return Rejected(request.id, request.pool, request.key, reason, detail, *request.origin)


def shown_input_file(uri: str, local_input: str | None = None, given_input: str | None = None) -> str:
    """An input file as a person named it: Spark's ``file:///x`` as ``/x``; a file of an ``s3://``
    input the job copied to ``local_input`` first as its ``s3://`` name under ``given_input``."""
    path = unquote(urlparse(uri).path) if uri.startswith("file:") else uri
    if local_input is None or given_input is None:
        return path
    local = local_input.rstrip("/")
    if path == local:
        return given_input
    if path.startswith(local + "/"):
        return posixpath.join(given_input.rstrip("/"), path[len(local) + 1:])
    return path
