"""``switchyard status`` (the whole system in a terminal) and ``switchyard console`` (the same, live, in
a browser): pools and their worker groups, the delay scheduler, the bus's subscribers, the pending
queue's endpoints. The figures come from ``switchyard.cli.overview``; this module only shows them."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from switchyard.cli.options import AT_LEAST_ONE, PORT, POSITIVE, add_json_option, iso_time, print_error, show
from switchyard.cli.overview import PARTS, Overview, SystemStatus
from switchyard.core.docs import docs_link
from switchyard.core.errors import ConfigError
from switchyard.core.observability import printable
from switchyard.core.tracing import DEFAULT_TRACE_LOG, slowest_handled, trace_log_path
from switchyard.rpc import protocol

if TYPE_CHECKING:
    from switchyard.bus.status import Telemetry
    from switchyard.delay.status import DelayStatus
    from switchyard.pending.status import PendingStatus
    from switchyard.rpc.status import PoolFigures

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen: one --watch frame replaces the last
NOTHING_REACHABLE = "no part of Switchyard could be read (each part's reason is above)"


def age(seconds: float | None) -> str:
    """A duration as a person reads it: ``4 s``, ``3 min``, ``2 h``, ``5 d``."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def ago(epoch_s: float | None, now: float) -> str:
    return "never" if epoch_s is None else f"{age(now - epoch_s)} ago"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def pool_lines(pool: PoolFigures, now: float, max_groups: int) -> list[str]:
    """One pool: its queues' figures, latency, then a line per group."""
    lines = [f"{pool.pool}: {len(pool.groups)} group{'' if len(pool.groups) == 1 else 's'}; orphans "
             f"{pool.orphans}, dead letters {pool.dead_letters}, poison {pool.poison}; spares {pool.spares}; "
             f"latency p99 {ms(pool.latency_p99_ms)}"]
    if pool.groups:
        lines.append(f"  {'key':32} {'state':9} {'workers':>7} {'backlog':>8}  last activity")
    for g in pool.groups[:max_groups]:
        seen = None if g.last_activity_ms is None else g.last_activity_ms / 1000
        last = "untracked" if g.state == "no state" else ago(seen, now)  # rpc.status.NO_STATE
        lines.append(f"  {printable(repr(g.key), 32):32} {g.state:9} {g.workers:>7} {g.backlog:>8}  {last}")
    if len(pool.groups) > max_groups:
        lines.append(f"  ... and {len(pool.groups) - max_groups} more (--max-groups, or --json)")
    if not pool.control_plane:
        waiting = f"; {pool.activity_waiting} worker reports wait in {protocol.activity_queue(pool.pool)}" \
            if pool.activity_waiting else ""
        lines.append(f"  no control plane is running{waiting} (it tracks groups and starts workers: "
                     f"switchyard local --pool {pool.pool}, or the deployed stack)")
    return lines


def delay_lines(d: DelayStatus) -> list[str]:
    if d.oldest_due_s:
        due = f"earliest waiting row due {age(d.oldest_due_s)} ago"
    else:
        due = f"next deadline in {age(d.next_deadline - d.at)}" if d.next_deadline else "nothing waiting"
    return [f"schema {d.schema}: {d.waiting} waiting, {d.ready} ready, {d.overdue} overdue, "
            f"{d.parked} parked; {due}; lateness p99 {ms(d.lateness_p99_ms)}"]


def table(empty: str, header: str, rows: list[str]) -> list[str]:
    """A header and its rows, or the line that says there are none."""
    return [header, *rows] if rows else [empty]


def bus_lines(t: Telemetry) -> list[str]:
    return table("no subscribers",
                 f"{'subscriber':30} {'queued':>8} {'batches':>8} {'oldest':>8} {'health':>7}",
                 [f"{printable(s.name, 30):30} {s.events:>8} {s.batches:>8} {age(s.oldest_age_ms / 1000):>8} "
                  f"{s.health_points:>7}" for s in t.subscribers])


def pending_lines(status: PendingStatus) -> list[str]:
    return table("no pending requests",
                 f"{'endpoint':30} {'waiting':>8} {'queued':>7} {'taken':>6} {'answered':>9} {'oldest':>8}",
                 [f"{printable(e.endpoint, 30):30} {e.waiting:>8} {e.queued:>7} {e.taken:>6} {e.answered:>9} "
                  f"{age(e.oldest_age_s):>8}" for e in status.endpoints])


def render(status: SystemStatus, max_groups: int = 20) -> list[str]:
    """The human view of ``status``: each part's lines under its title, or why it is unreachable."""
    where = f"stack configuration {status.source}" if status.source else "local settings"
    lines = [f"Switchyard at {iso_time(status.at)} ({where})"]
    for name, title in (("rpc", "RPC pools"), ("delay", "Delay scheduler"), ("bus", "Event bus subscribers"),
                        ("pending", "Pending endpoints")):
        part = status.part(name)
        lines += ["", title]
        if part.unreachable is not None:
            body = [f"unreachable: {part.unreachable}"]
        elif name == "rpc":
            body = [line for pool in part.figures.pools for line in pool_lines(pool, status.at, max_groups)]\
                or ["no pools"]
        elif name == "delay":
            body = delay_lines(part.figures)
        elif name == "bus":
            body = bus_lines(part.figures)
        else:
            body = pending_lines(part.figures)
        lines += [f"  {line}" for line in body]
    return lines


def _frames(overview: Overview, count: int | None, interval: float,
            stop: threading.Event) -> Iterable[SystemStatus]:
    done = 0
    while not stop.is_set():
        started = time.monotonic()
        yield overview.read()
        done += 1
        if count is not None and done >= count:
            return
        stop.wait(max(0.0, interval - (time.monotonic() - started)))


def cmd_status(args: argparse.Namespace) -> int:
    pools = [protocol.validate_pool(pool) for pool in args.pool or ()]
    if pools:  # a pool named that does not exist is an error, as in `switchyard pool status`
        from switchyard.rpc.control.topology import PoolTopology
        from switchyard.rpc.settings import RpcSettings

        settings = RpcSettings.from_env()
        for pool in pools:
            with PoolTopology(pool, settings) as topology:
                topology.require()
    overview = Overview(pools)
    count = args.count if args.watch else 1
    last: SystemStatus | None = None
    stop = threading.Event()
    if args.watch:
        # Ctrl-C ends the watch between frames: raised inside a read, it became that client's error
        # (psycopg turns it into a cancelled query), and the watch ended with exit 1.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    try:
        for status in _frames(overview, count, args.interval, stop):
            last = status
            if args.json:
                print(json.dumps(status.to_dict()), flush=True)
            else:
                if args.watch:
                    sys.stdout.write(CLEAR)
                show(*render(status, args.max_groups), flush=True)
    finally:
        overview.close()
    if last is not None and not last.reachable and not args.watch:
        return print_error(NOTHING_REACHABLE)
    if last is not None and not args.watch:
        rpc = last.part("rpc")
        if rpc.unreachable is not None:
            return print_error(f"the RPC pools could not be read: {rpc.unreachable}")
    return 0


def console_figures(overview: Overview) -> dict[str, Any]:
    """What the console shows: the status, its history's span, and per pool and key the slowest
    request of that span in the trace log (the page gives the `switchyard trace ID` that shows its hops)."""
    from switchyard.delay.status import LATENESS_SPAN_S
    from switchyard.rpc.status import LATENCY_SLOT_S, LATENCY_SPAN_S

    status = overview.read()
    traces = slowest_handled(trace_log_path() or DEFAULT_TRACE_LOG, status.at - LATENCY_SPAN_S)
    return {**status.to_dict(), "history_s": LATENCY_SPAN_S, "slot_s": LATENCY_SLOT_S,
            "delay_history_s": LATENESS_SPAN_S, "traces": traces}


def cmd_console(args: argparse.Namespace) -> int:
    from switchyard.local.console import Console

    overview = Overview([protocol.validate_pool(pool) for pool in args.pool or ()])
    first = overview.read()
    if not first.reachable:
        overview.close()
        raise ConfigError("no part of Switchyard could be read: "
                          + "; ".join(f"{part.part}: {part.unreachable}" for part in first.parts))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    console = Console(lambda: console_figures(overview), host=args.host, port=args.port,
                      interval_s=args.interval)
    try:
        with console:
            show(f"Switchyard console on {console.url}/ (figures at {console.url}/status.json, every "
                 f"{args.interval:g} s); Ctrl-C to stop", flush=True)
            stop.wait()
    finally:
        overview.close()
    return 0


def _pool_filter(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", action="append", metavar="NAME",
                        help="show this pool only (repeat for several; default: every pool in Redis or "
                             "declared on the broker)")


def register(subparsers: argparse._SubParsersAction) -> None:
    status = subparsers.add_parser(
        "status", help="the whole system: pools and groups, delay scheduler, bus subscribers, pending "
                       "endpoints",
        description=f"Read every part ({', '.join(PARTS)}) from its services and print the figures. A part "
                    "whose services do not answer is shown as unreachable; exit 1 when the RPC pools "
                    "(the broker) or no part could be read, or a pool named with --pool does not exist. "
                    f"See {docs_link('operations.md')}.")
    _pool_filter(status)
    status.add_argument("--watch", action="store_true",
                        help="redraw every --interval seconds until Ctrl-C (with --json: one JSON document "
                             "per line per refresh)")
    status.add_argument("--interval", type=POSITIVE, default=2.0,
                        help="seconds between refreshes (default 2)")
    status.add_argument("--count", type=AT_LEAST_ONE, default=None,
                        help="with --watch: stop after this many refreshes (default: until Ctrl-C)")
    status.add_argument("--max-groups", type=AT_LEAST_ONE, default=20,
                        help="groups listed per pool in the human view (default 20; --json lists all)")
    add_json_option(status)
    status.set_defaults(func=cmd_status)

    console = subparsers.add_parser(
        "console", help="serve a live status page (the figures of switchyard status, with charts)",
        description="Serve the status page and its figures (/status.json) over HTTP until Ctrl-C. It listens "
                    "on 127.0.0.1 unless --host says otherwise: the page has no login.")
    _pool_filter(console)
    console.add_argument("--host", default="127.0.0.1",
                         help="address to listen on (default 127.0.0.1); the page answers to this name, "
                              "the loopback names and IP addresses only")
    console.add_argument("--port", type=PORT, default=8070,
                         help="port to listen on (default 8070; 0: any free)")
    console.add_argument("--interval", type=POSITIVE, default=2.0,
                         help="seconds between the page's refreshes (default 2)")
    console.set_defaults(func=cmd_console)

