"""``switchyard bus ...``: serve the API, run delivery workers, manage tokens, show the state."""

from __future__ import annotations

import argparse
import json
import signal
import threading

from switchyard.bus.settings import ROOT_KEY, WORKER_THREADS
from switchyard.cli.local import quiet_metrics
from switchyard.cli.options import AT_LEAST_ONE, PORT, add_commands, add_json_option, show
from switchyard.cli.preflight import require
from switchyard.core.tracing import enable_trace_log


def _bus():
    """The bus over Redis, which is checked first (a second, not the client's retries)."""
    from switchyard.bus.service import build_service
    from switchyard.bus.settings import BusSettings
    from switchyard.core.config import Connections

    require("redis")
    return build_service(BusSettings.from_env(), Connections.from_env())


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def cmd_serve(args: argparse.Namespace) -> int:
    """The API over real HTTP, as API Gateway REST would hand it to the Lambda function."""
    quiet_metrics()
    enable_trace_log()
    from switchyard.local.http_gateway import HttpGateway

    bus = _bus()
    store = bus.store
    stop = _stop_event()
    with HttpGateway(bus.app(), host=args.host, port=args.port, threads=args.threads,
                     function_name="bus_api") as gateway:
        root = "set" if store.settings.root_key else f"NOT set ({ROOT_KEY.name}): no token management"
        show(f"event bus {store.settings.name!r} API on {gateway.url} (root key {root}); Ctrl-C to stop",
             flush=True)
        stop.wait()
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Delivery threads and housekeeping until SIGTERM/SIGINT; in-flight deliveries finish first."""
    quiet_metrics()
    enable_trace_log()
    bus = _bus()
    store = bus.store
    worker = bus.worker(threads=args.threads)
    show(f"event bus {store.settings.name!r} worker {worker.process_id}: "
         f"{len(worker.worker_ids) - 1} delivery threads; Ctrl-C to stop", flush=True)
    worker.run(_stop_event())
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    """Register a client directly in Redis (what ``POST /api_tokens`` does with the root key)."""
    show(_bus().store.create_token(args.name, args.token))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from switchyard.bus.status import read_telemetry
    from switchyard.cli.status import bus_lines

    state = read_telemetry(_bus().store)
    if args.json:
        print(json.dumps(state.to_dict(), indent=2))
        return 0
    show(*bus_lines(state))
    for queue, lengths in state.jobs.items():
        show(f"jobs {queue}: " + ", ".join(f"{n} {kind}" for kind, n in lengths.items()))
    show(f"redis memory {state.used_memory / 2**20:.1f} MiB; events autodropped {state.autodropped}")
    return 0


def cmd_openapi(_args: argparse.Namespace) -> int:
    from switchyard.bus.api import openapi_document

    print(openapi_document())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    bus = subparsers.add_parser("bus", help="the event bus (Routemaster's API): serve, worker, token, status")
    sub = add_commands(bus, "bus_command")
    bus.set_defaults(func=lambda _args: bus.print_help() or 2)

    serve = sub.add_parser("serve", help="serve the HTTP API locally (the Lambda function's resolver)")
    serve.add_argument("--port", type=PORT, default=8090, help="0: any free port")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--threads", type=AT_LEAST_ONE, default=32, help="requests in progress at once")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="deliver batches; housekeeping (autodrop, scrub, telemetry)")
    worker.add_argument("--threads", type=AT_LEAST_ONE,
                        help=f"delivery threads ({WORKER_THREADS.name})")
    worker.set_defaults(func=cmd_worker)

    token = sub.add_parser("token", help="register a client token directly in Redis; prints the token")
    token.add_argument("name", help="client name, [a-z0-9:_-]{1,64}")
    token.add_argument("--token", help="the token itself (default <name>--<32 hex>)")
    token.set_defaults(func=cmd_token)

    status = sub.add_parser("status", help="print the telemetry: queued events, health points, jobs, memory")
    add_json_option(status)
    status.set_defaults(func=cmd_status)

    openapi = sub.add_parser("openapi", help="print the API's OpenAPI document")
    openapi.set_defaults(func=cmd_openapi)
