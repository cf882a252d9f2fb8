"""``switchyard demo``: the main job on the local stack, with a summary a person can read.

A fresh pool with its control plane running locally (the Lambda handlers behind RabbitMQ
event-source bridges, the reconciler ticking, workers as subprocesses) is called from cold to idle
(``rpc_pool``, with the Spark job of ``spark_job`` while it runs) and summed up (``summary``); then
the delay scheduler, scheduled calls (through it into a pool), the event bus and the pending request
queue each show their own job. Everything
it created is deleted at the end (unless ``--keep``). The ``switchyard`` command registers it from
here; nothing heavier than the standard library is imported until it runs.
"""

from __future__ import annotations

import argparse
import os

from switchyard.cli.options import add_stack_option
from switchyard.core import parts
from switchyard.demo.delay_scheduler import delay_scheduler_part
from switchyard.demo.event_bus import event_bus_part
from switchyard.demo.pending_queue import pending_queue_part
from switchyard.demo.printer import Printer
from switchyard.demo.rpc_pool import KEYS, PoolOptions, rpc_pool_part
from switchyard.demo.scheduled_calls import scheduled_calls_part
from switchyard.demo.spark_job import spark_part
from switchyard.demo.summary import print_summary

__all__ = ["KEYS", "Printer", "delay_scheduler_part", "event_bus_part", "follow_one_request",
           "pending_queue_part", "register", "run_demo", "scheduled_calls_part", "spark_part"]


def run_demo(args: argparse.Namespace) -> int:
    # Powertools reads its switch from the environment only: nothing reads the EMF blobs here.
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    from switchyard.cli.preflight import require
    from switchyard.core.observability import logger
    from switchyard.core.tracing import enable_trace_log
    from switchyard.rpc.settings import RpcSettings

    trace_log = enable_trace_log()  # `switchyard trace ID` follows one request of the demo

    chosen = args.parts
    require(*parts.services_of(chosen))  # one line, in a second, if one is down
    if not args.verbose:
        logger.setLevel("ERROR")
    out = Printer()
    pool_run = None
    if parts.RPC in chosen:  # with the Spark job while its traffic runs, when spark is chosen
        options = PoolOptions(pool=args.pool, keys=args.keys, seconds=args.seconds,
                              concurrency=args.concurrency, unbind_delay=args.unbind_delay,
                              stop_delay=args.stop_delay, keep=args.keep, spark=parts.SPARK in chosen)
        pool_run = rpc_pool_part(out, options, RpcSettings.from_env())
        print_summary(out, pool_run)
    if parts.DELAY in chosen:
        delay_scheduler_part(out)
        if parts.RPC in chosen:
            scheduled_calls_part(out)
    if parts.BUS in chosen:
        event_bus_part(out)
    if parts.PENDING in chosen:
        pending_queue_part(out)
    if trace_log is not None and pool_run is not None:
        follow_one_request(out, trace_log, pool_run.pool)
    return 0


def _parts(raw: str) -> tuple[str, ...]:
    """``--parts``: the chosen parts, spark with what it needs."""
    try:
        chosen = parts.parse_parts(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if parts.SPARK in chosen and not {parts.RPC, parts.DELAY} <= set(chosen):
        raise argparse.ArgumentTypeError("spark needs rpc and delay (its rows are calls scheduled through "
                                         "the delay scheduler into a pool): add them, or leave spark out")
    return chosen


def follow_one_request(out: Printer, trace_log: str, pool: str) -> None:
    """The hops of the first request that started one of ``pool``'s worker groups, from the local
    trace log."""
    from switchyard.cli.trace import first_cold_start, hop_lines
    from switchyard.core.tracing import read_hops

    out.section("Following one request")
    trace_id = first_cold_start(trace_log, pool)
    if trace_id is not None:
        out.line(f"switchyard trace {trace_id}")
        for line in hop_lines(read_hops(trace_id, trace_log)):
            out.line(f"  {line}")
    out.line(f"every hop of every request is in {trace_log} (`switchyard trace ID`; ID: a response's "
             "traceparent, or a log line's correlation_id)")


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="run the local stack with demo traffic and print what happened")
    demo.add_argument("--seconds", type=float, default=5.0, help="length of the traffic phase")
    demo.add_argument("--keys", type=int, default=4, help=f"keys to call (1-{len(KEYS)})")
    demo.add_argument("--concurrency", type=int, default=32, help="calls in flight during the traffic phase")
    demo.add_argument("--unbind-delay", type=float, default=3.0, help="seconds idle before a group unbinds")
    demo.add_argument("--stop-delay", type=float, default=3.0, help="seconds unbound before a group stops")
    demo.add_argument("--pool", help="pool name (default: a fresh demo_<6 hex digits>)")
    demo.add_argument("--keep", action="store_true", help="keep the pool afterwards")
    demo.add_argument("--verbose", action="store_true", help="show the structured logs too")
    demo.add_argument("--parts", type=_parts, default=parts.PARTS, metavar="LIST",
                      help=f"the parts to show, comma-separated (default all: {','.join(parts.PARTS)}); "
                           "only their services need to run (rpc: RabbitMQ and Redis; delay: Postgres and "
                           "Kafka; pending, bus: Redis)")
    add_stack_option(demo)
    demo.set_defaults(func=run_demo)
