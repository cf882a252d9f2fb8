"""``switchyard trace ID``: the hops of one trace, in time order, from the local trace log."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
from datetime import UTC, datetime
from typing import Any

from switchyard.cli.options import add_json_option, show
from switchyard.core.errors import SwitchyardError
from switchyard.core.tracing import DEFAULT_TRACE_LOG, TRACE_LOG_ENV, parse, read_hops, trace_log_path

_TRACE_ID = re.compile(r"[0-9a-f]{32}")
# What a hop's line shows besides its time, process, part and event (when the hop has them).
_SHOWN_FIELDS = ("pool", "key", "id", "status", "reason", "worker_id", "cold_start", "late_ms")


def trace_id(text: str) -> str:
    """A 32-hex trace id, or the trace id of a whole ``traceparent`` value."""
    value = text.strip().lower()
    if _TRACE_ID.fullmatch(value) and value != "0" * 32:
        return value
    context = parse(value)
    if context is None:
        raise argparse.ArgumentTypeError(f"not a trace id (32 hex digits) or a traceparent: {text[:80]!r}")
    return context.trace_id


def cmd_trace(args: argparse.Namespace) -> int:
    path = args.log or trace_log_path() or DEFAULT_TRACE_LOG
    hops = read_hops(args.trace_id, path)
    if not hops:
        where = os.path.abspath(path)
        what = f"no hop of trace {args.trace_id} in {where}" if os.path.exists(path) else \
            f"there is no trace log at {where}"
        raise SwitchyardError(
            f"{what} (or its .1): "
            "`switchyard local`, `delay run` and `demo` write hops there (relative to the directory they "
            f"run in) for themselves and the workers they start; a worker, client or app of yours writes "
            f"them only with {TRACE_LOG_ENV}=PATH set; run this where they ran, or give --log PATH")
    if args.json:
        print(json.dumps({"trace_id": args.trace_id, "log": path, "hops": hops}))
        return 0
    show(f"trace {args.trace_id}: {len(hops)} hops from {path}", *(f"  {line}" for line in hop_lines(hops)))
    return 0


def hop_lines(hops: list[dict[str, Any]]) -> list[str]:
    """One line per hop: its UTC time, the time since the first hop, the process, part and event,
    how long it took and what names the request."""
    first = float(hops[0].get("time") or 0) if hops else 0.0
    lines = []
    for hop in hops:
        at = float(hop.get("time") or 0)
        clock = datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]
        took = f" took {hop['duration_ms']:g} ms" if isinstance(hop.get("duration_ms"), int | float) else ""
        extra = " ".join(f"{name}={hop[name]}" for name in _SHOWN_FIELDS if hop.get(name) is not None)
        lines.append(f"{clock} +{(at - first) * 1000:9.1f} ms  {hop.get('process', '?'):<28} "
                     f"{hop.get('part', '?')}: {hop.get('event', '?')}{took}  {extra}".rstrip())
    return lines


def first_cold_start(path: str, pool: str) -> str | None:
    """The trace id of the first request in the trace log that started a worker group of ``pool``
    (the log outlives runs: the demo's and the tests' pools are all in it)."""
    for name in (path + ".1", path):
        try:
            with open(name, encoding="utf-8", errors="replace") as log:
                for line in log:
                    if '"cold_start":true' in line:
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            hop = json.loads(line)
                            if hop["pool"] == pool:
                                return str(hop["trace_id"])
        except FileNotFoundError:
            continue
    return None


def register(subparsers: argparse._SubParsersAction) -> None:
    trace = subparsers.add_parser(
        "trace", help="print the hops of one trace in time order (from the local runtime's trace log)",
        description="Every hop the local runtime, its workers and the clients logged for one trace: "
                    "when, in which process and part, what happened and how long it took.")
    trace.add_argument("trace_id", metavar="ID", type=trace_id,
                       help="the trace id (32 hex: a log line's correlation_id) or a whole traceparent")
    trace.add_argument("--log", metavar="PATH",
                       help=f"the trace log to read (default: {TRACE_LOG_ENV}, else {DEFAULT_TRACE_LOG})")
    add_json_option(trace)
    trace.set_defaults(func=cmd_trace)
