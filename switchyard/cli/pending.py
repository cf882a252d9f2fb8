"""``switchyard pending serve|call|status|echo``: the pending request queue from the command line."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from urllib.parse import urlsplit

from switchyard.cli.options import AT_LEAST_ONE, PORT, POSITIVE, add_commands, add_json_option, show
from switchyard.cli.preflight import reach, require
from switchyard.core.docs import docs_link
from switchyard.core.errors import ConfigError
from switchyard.core.tracing import enable_trace_log
from switchyard.pending.settings import PENDING, TOKENS


def _serve(args: argparse.Namespace) -> int:
    from switchyard.cli.local import quiet_metrics
    from switchyard.local.http_gateway import HttpGateway
    from switchyard.pending.api import TokenStore, build_app
    from switchyard.pending.service import build_service
    from switchyard.pending.settings import PendingSettings

    quiet_metrics()
    enable_trace_log()
    require("redis")
    tokens = TokenStore.from_env()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    queue = build_service(PendingSettings.from_env()).start()
    gateway = HttpGateway(build_app(queue, tokens), host=args.host, port=args.port, threads=args.threads,
                          function_name="pending-api").start()
    try:
        show(f"pending node {queue.node_id} serving polling services on {gateway.url} "
             f"(long poll up to {queue.settings.http_poll_wait_s:g} s); Ctrl-C to stop", flush=True)
        if not tokens.endpoints():
            show(f"warning: no endpoint tokens ({TOKENS.name}): every endpoint answers 401",
                 file=sys.stderr, flush=True)
        stop.wait()
    finally:
        queue.close()  # first: open long polls end now (204) instead of at their wait
        gateway.stop()
    return 0


def _parse_body(raw: str) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # plain text is sent as a JSON string


def _call(args: argparse.Namespace) -> int:
    from switchyard.pending import CancelToken
    from switchyard.pending.service import build_service
    from switchyard.pending.settings import PendingSettings

    require("redis")
    cancel = CancelToken()
    if args.timeout:
        cancel.cancel_after(args.timeout)
    with build_service(PendingSettings.from_env()) as queue:
        started = time.monotonic()
        response = queue.queue_and_wait(args.endpoint, _parse_body(args.body), cancel=cancel,
                                        pickup_timeout=args.pickup_timeout)
        json.dump({"body": response.body, "streams": [s.to_json() for s in response.streams],
                   "elapsed_ms": round((time.monotonic() - started) * 1000, 1)}, sys.stdout)
        print()
    return 0


def _status(args: argparse.Namespace) -> int:
    from switchyard.cli.status import pending_lines
    from switchyard.pending.service import build_service
    from switchyard.pending.settings import PendingSettings
    from switchyard.pending.status import pending_status

    require("redis")
    node = build_service(PendingSettings.from_env())
    status = pending_status(node)  # no background threads: status only reads
    if args.json:
        json.dump(status.to_dict(), sys.stdout, indent=2)
        print()
        return 0
    show(*pending_lines(status))
    return 0


def _echo(args: argparse.Namespace) -> int:
    from switchyard.pending.client import PollingService

    _require_node(args.url)
    service = PollingService(args.url, args.endpoint, args.token, lambda request: {"echo": request.body},
                             concurrency=args.concurrency)
    show(f"echo service polling {args.url} for endpoint {args.endpoint!r}; Ctrl-C to stop", flush=True)
    service.run_forever()
    return 0


def _require_node(url: str) -> None:
    """The node at ``--url`` accepts connections (the service would otherwise retry in silence)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigError(f"--url {url!r} is not a URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigError(f"--url must be http(s)://HOST[:PORT] of a pending node, got {url!r}")
    reason = reach(host, port)
    if reason:
        raise ConfigError(f"cannot reach the pending node at {host}:{port} (--url): {reason}; "
                          "start one with switchyard pending serve or give its --url")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``pending`` and its subcommands to the ``switchyard`` command line."""
    pending = subparsers.add_parser(
        "pending", help="pending request queue: RPC to polling services through Redis",
        description="Pending request queue. Configuration: SWITCHYARD_PENDING_* variables "
                    f"({docs_link('configuration.md')}).")
    pending.set_defaults(func=lambda _args: pending.print_help() or 2)
    sub = add_commands(pending, "pending_command")

    serve = sub.add_parser("serve", help="a node: the HTTP long-poll API for polling services",
                           description="Serve the node API (the Lambda's resolver) on HOST:PORT. Tokens: "
                                       f'{TOKENS.name}=\'{{"endpoint": "token"}}\'.')
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=PORT, default=8765, help="0: any free port")
    serve.add_argument("--threads", type=AT_LEAST_ONE, default=512, help="long polls that can wait at once")
    serve.set_defaults(func=_serve)

    call = sub.add_parser("call", help="send one request to an endpoint and print the response",
                          description="QueueAndWait from this process (a caller node).")
    call.add_argument("--endpoint", required=True, help="the endpoint a polling service answers for")
    call.add_argument("--body", default="null", help="JSON (plain text is sent as a string)")
    call.add_argument("--pickup-timeout", type=POSITIVE, help=f"seconds ({PENDING['pickup_timeout_s'].name})")
    call.add_argument("--timeout", type=POSITIVE, help="cancel the call after this many seconds")
    add_json_option(call, always=True)
    call.set_defaults(func=_call)

    status = sub.add_parser("status", help="queue depth, in-flight requests and oldest age per endpoint")
    add_json_option(status)
    status.set_defaults(func=_status)

    echo = sub.add_parser("echo", help="a polling service that answers {'echo': body} (for trying it out)")
    echo.add_argument("--url", default="http://127.0.0.1:8765", help="the pending node to poll")
    echo.add_argument("--endpoint", required=True, help="the endpoint to answer for")
    echo.add_argument("--token", required=True, help=f"the endpoint's token ({TOKENS.name})")
    echo.add_argument("--concurrency", type=AT_LEAST_ONE, default=4, help="requests answered at once")
    echo.set_defaults(func=_echo)

