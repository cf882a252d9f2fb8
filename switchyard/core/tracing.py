"""One trace through every hop: the W3C ``traceparent`` every part carries, and the local trace log.

A request carries ``traceparent: 00-<trace id>-<parent id>-<flags>`` (W3C Trace Context, so
OpenTelemetry and X-Ray read it) in whatever its part sends: an AMQP header (RPC requests and
responses), a Kafka header (delay records), an event field (the bus), a request field (the pending
queue), a column (Spark rows). ``tracestate`` rides along untouched where the carrier has headers.

Parsing is strict: version ``00``, a 32-hex trace id and a 16-hex parent id (lower case, neither
all zeros), 2 hex flags. A malformed value is never an error for the request: a new trace starts,
``stats.malformed`` counts it and a warning shows the value cut and escaped (for the 1st, 2nd,
4th, 8th, ... of the process: a flood of them writes a few lines).

While a request is processed, ``scope(context)`` makes its trace id the Powertools Logger's
correlation id (thread-local, so only the lines written about that request carry it), and the
trace ids a Lambda invocation saw are annotated on its X-Ray segment (``xray_root``: the W3C id in
X-Ray's form). Locally, ``hop(...)`` appends one JSON line per hop to the trace log that
``switchyard trace ID`` reads (``SWITCHYARD_TRACE_LOG``; the local runtime turns it on); a function
on AWS never writes it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from switchyard.core.errors import ConfigError
from switchyard.core.observability import logger, note_trace, xray_root
from switchyard.core.settings import TRACE_LOG, TRACE_LOG_MAX_BYTES

TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"
TRACE_LOG_ENV = TRACE_LOG.name
TRACE_LOG_MAX_BYTES_ENV = TRACE_LOG_MAX_BYTES.name
DEFAULT_TRACE_LOG = ".local/logs/trace.jsonl"
DEFAULT_TRACE_LOG_MAX_BYTES = 16 * 1024 * 1024  # then it moves to <path>.1 (one older file kept)
_OFF = ("", "0", "off", "false", "no")
_TRACEPARENT_RE = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_SHOWN_CHARS = 64  # of a malformed value, in its warning


@dataclass(frozen=True, slots=True)
class TraceContext:
    """One hop's place in a trace: the trace id, this hop's span id, and the flags (``01``: sampled)."""

    trace_id: str
    span_id: str
    flags: str = "01"
    parent_id: str | None = None  # the span this one continues (None: the trace's first)

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self) -> TraceContext:
        """The next hop: same trace, a new span id (its parent is this one)."""
        return TraceContext(self.trace_id, _span_id(), self.flags, self.span_id)

    @property
    def xray_root(self) -> str:
        """The trace id in X-Ray's form (``observability.xray_root``)."""
        return xray_root(self.trace_id)


@dataclass
class TraceStats:
    """What this process saw: incoming values that were malformed (a new trace replaced each)."""

    malformed: int = 0


stats = TraceStats()
_current: ContextVar[TraceContext | None] = ContextVar("switchyard_trace", default=None)


def _span_id() -> str:
    span = os.urandom(8).hex()
    return span if span != _ZERO_SPAN else _span_id()


def new_trace() -> TraceContext:
    """A new trace (random 128-bit id, sampled)."""
    trace = os.urandom(16).hex()
    return TraceContext(trace, _span_id()) if trace != _ZERO_TRACE else new_trace()


def parse(value: object) -> TraceContext | None:
    """The context a ``traceparent`` value (str or bytes) names, or None if it is not a valid one."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT_RE.fullmatch(value)
    if match is None or match[1] == _ZERO_TRACE or match[2] == _ZERO_SPAN:
        return None
    return TraceContext(match[1], match[2], match[3])


def shown(value: object) -> str:
    """A value as a log line may show it: at most 64 characters, escaped (no control characters)."""
    text = value if isinstance(value, str) else repr(value)
    cut = text[:_SHOWN_CHARS]
    return (cut.encode("unicode_escape").decode("ascii")) + ("..." if len(text) > _SHOWN_CHARS else "")


def continue_from(value: object) -> TraceContext:
    """This hop's context under an incoming ``traceparent`` value: its child, or a new trace when
    the value is absent or malformed (counted, warned; never an error for the request). Noted for
    the X-Ray segment of a Lambda invocation (``observability.joins_traces``)."""
    parent = parse(value) if value is not None else None
    if parent is not None:
        context = parent.child()
    else:
        if value is not None:
            stats.malformed += 1
            if stats.malformed & (stats.malformed - 1) == 0:  # the 1st, 2nd, 4th, ...: a flood stays short
                logger.warning("malformed traceparent; starting a new trace",
                               extra={"traceparent": shown(value), "malformed_so_far": stats.malformed})
        context = new_trace()
    note_trace(context.trace_id)
    return context


def from_headers(headers: Mapping[str, Any] | None) -> TraceContext:
    """``continue_from`` the ``traceparent`` of a message's headers."""
    return continue_from(headers.get(TRACEPARENT_HEADER) if headers else None)


def in_pairs(headers: Iterable[tuple[str, Any]]) -> TraceContext | None:
    """The context a list of ``(name, value)`` headers (Kafka's) names in ``traceparent``, if valid."""
    for name, value in headers:
        if name == TRACEPARENT_HEADER:
            return parse(value)
    return None


def current() -> TraceContext | None:
    """The context of the request this thread is processing, if any."""
    return _current.get()


def outgoing() -> TraceContext:
    """The context of a new message: a child of the current request's, else a new trace."""
    context = _current.get()
    return context.child() if context is not None else new_trace()


def outgoing_traceparent() -> str:
    """``outgoing().traceparent``, at the cost of one ``os.urandom`` when no request is in hand
    (the RPC client's per-call path)."""
    context = _current.get()
    if context is not None:
        return context.child().traceparent
    ids = os.urandom(24).hex()
    if ids.startswith(_ZERO_TRACE) or ids.endswith(_ZERO_SPAN):
        return new_trace().traceparent
    return f"00-{ids[:32]}-{ids[32:]}-01"


@contextmanager
def scope(context: TraceContext) -> Iterator[TraceContext]:
    """Process one request under ``context``: its trace id is the logger's correlation id (on this
    thread only) and the current context for anything the request sends on."""
    token = _current.set(context)
    logger.thread_safe_append_keys(correlation_id=context.trace_id)
    try:
        yield context
    finally:
        _current.reset(token)
        logger.thread_safe_remove_keys(["correlation_id"])


@contextmanager
def scope_if(context: TraceContext | None) -> Iterator[TraceContext | None]:
    """``scope(context)``, or nothing when there is no context (a message without a valid one)."""
    if context is None:
        yield None
        return
    with scope(context):
        yield context


# -- the local trace log ------------------------------------------------------------------------
def trace_log_path() -> str | None:
    """Where hops are written (``SWITCHYARD_TRACE_LOG``), None when off or inside a Lambda function."""
    path = TRACE_LOG.read(os.environ)
    if not path or path.strip().lower() in _OFF or os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        return None
    return path


def enable_trace_log(path: str | None = None) -> str | None:
    """Turn the trace log on for this process and the processes it starts (the local runtime's
    call): ``path``, else the variable's own value, else ``.local/logs/trace.jsonl``. A variable
    set to ``off`` keeps it off. Returns the path in use."""
    if path is None and TRACE_LOG_ENV in os.environ:  # set, even to "off" or empty: the caller's choice
        return trace_log_path()
    os.environ[TRACE_LOG_ENV] = path or DEFAULT_TRACE_LOG  # the interface of the workers it starts
    return trace_log_path()


def _max_bytes() -> int:
    try:
        return max(4096, TRACE_LOG_MAX_BYTES.read(os.environ))
    except ConfigError:
        return DEFAULT_TRACE_LOG_MAX_BYTES


def _process_name() -> str:
    """``switchyard[pid]``, ``pytest[pid]``: the program, as a person started it (``-m`` included)."""
    program = sys.argv[0] if sys.argv and sys.argv[0] and sys.argv[0] != "-c" else "python"
    name = os.path.basename(program)
    if name == "__main__.py":  # python -m package
        name = os.path.basename(os.path.dirname(program))
    return f"{name}[{os.getpid()}]"


_PROCESS = _process_name()


def hop(context: TraceContext | None, part: str, event: str, *, duration_ms: float | None = None,
        at: float | None = None, **fields: Any) -> None:
    """Append one hop of a trace to the trace log, when it is on (otherwise nothing, at the cost of
    one lookup); ``fields``: what identifies the request (key, pool, id). ``at``: when it happened
    (epoch seconds; default now), for a hop known only later (a publish once it is confirmed): the
    log is read in time order."""
    if context is None:
        return
    path = trace_log_path()
    if path is None:
        return
    record: dict[str, Any] = {"time": time.time() if at is None else at, "trace_id": context.trace_id,
                              "span_id": context.span_id, "parent_id": context.parent_id,
                              "process": _PROCESS, "part": part, "event": event}
    if duration_ms is not None:
        record["duration_ms"] = round(duration_ms, 3)
    record.update(fields)
    line = json.dumps(record, default=str, separators=(",", ":")) + "\n"
    try:
        _trace_log.write(path, line)
    except OSError as exc:  # a full disk or a read-only directory never fails the request
        logger.debug("trace log not written", extra={"path": path, "error": str(exc)})


class _TraceLog:
    """This process's append handle on the trace log: one line per write, whole (O_APPEND), from
    any thread. Another process may have rotated the file: the handle is checked against the path
    at most once a second and reopened (lines written meanwhile are in ``<path>.1``, read too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._path: str | None = None
        self._file: Any = None
        self._checked = 0.0

    def write(self, path: str, line: str) -> None:
        with self._lock:
            now = time.monotonic()
            if self._file is None or path != self._path or now - self._checked > 1.0:
                self._open(path)
                self._checked = now
            self._file.write(line)
            self._file.flush()
            if self._file.tell() > _max_bytes():
                os.replace(path, path + ".1")
                self._close()

    def _open(self, path: str) -> None:
        if self._file is not None and path == self._path:
            try:
                if os.stat(path).st_ino == os.fstat(self._file.fileno()).st_ino:
                    return
            except FileNotFoundError:
                pass
        self._close()
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open: one per process)
        self._path = path

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None


_trace_log = _TraceLog()


def read_hops(trace_id: str, path: str) -> list[dict[str, Any]]:
    """Every hop of ``trace_id`` in the trace log (its older file first), in time order."""
    hops: list[dict[str, Any]] = []
    for name in (path + ".1", path):
        try:
            with open(name, encoding="utf-8", errors="replace") as log:
                for line in log:
                    if trace_id not in line:
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue  # a line cut by a crash or a rotation
                    if isinstance(record, dict) and record.get("trace_id") == trace_id:
                        hops.append(record)
        except FileNotFoundError:
            continue
    hops.sort(key=lambda record: record.get("time") or 0)
    return hops


SLOWEST_TAIL_BYTES = 4 * 1024 * 1024  # how much of the trace log's end the console reads per refresh


def slowest_handled(path: str, since_s: float, tail_bytes: int = SLOWEST_TAIL_BYTES
                    ) -> dict[str, dict[str, dict[str, Any]]]:
    """Per pool and worker key, the slowest request a worker handled since ``since_s`` (its
    ``handled`` hop: ``trace_id``, ``duration_ms``, ``worker_id``, ``time``), from the end of the trace
    log only: the console links a latency figure to ``switchyard trace ID`` with it."""
    slowest: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - tail_bytes))
            lines = log.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return slowest
    for line in lines:
        if '"handled"' not in line:  # cheap: most lines are other hops
            continue
        try:
            hop = json.loads(line)
            at, pool, key, took = float(hop["time"]), hop["pool"], hop["key"], float(hop["duration_ms"])
            if hop["event"] != "handled":
                continue
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a crash or a rotation, or a hop of another part
        keys = slowest.setdefault(str(pool), {})
        if at >= since_s and isinstance(key, str) and took > keys.get(key, {}).get("duration_ms", -1.0):
            keys[key] = {"trace_id": str(hop.get("trace_id")), "duration_ms": took,
                         "worker_id": hop.get("worker_id"), "time": at}
    return {pool: keys for pool, keys in slowest.items() if keys}
