"""``switchyard delay``: run the scheduler locally, migrate, invoke a handler, send a test message."""

from __future__ import annotations

import argparse
import base64
import json
import signal
import sys
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import Producer

from switchyard.cli.local import invoke_handler, read_event
from switchyard.cli.options import AT_LEAST_ONE, COUNT, add_commands, add_json_option, show
from switchyard.cli.preflight import require
from switchyard.core.config import KAFKA_BOOTSTRAP, Connections
from switchyard.core.docs import docs_link
from switchyard.core.errors import ConfigError
from switchyard.core.observability import printable
from switchyard.core.tracing import enable_trace_log
from switchyard.delay.errors import BrokerError
from switchyard.delay.model import DEADLINE_HEADER, MESSAGE_ID_HEADER, ParkedMessage
from switchyard.delay.parsing import format_deadline, parse_deadline
from switchyard.delay.service import build_service
from switchyard.delay.settings import DELAY, DelaySettings, validate_topic
from switchyard.local import delay_runtime as runtime
from switchyard.local.lambda_context import FakeLambdaContext


def ship_metrics(family: str) -> None:
    """With ``SWITCHYARD_SHIP_METRICS=1`` the handlers' metrics go to CloudWatch, as deployed."""
    from switchyard.local.metrics_shipper import FUNCTION_SERVICES, ship_if_enabled

    ship_if_enabled(FUNCTION_SERVICES[family])


def _run(args: argparse.Namespace) -> int:
    ship_metrics("delay")
    enable_trace_log()
    settings, connections = DelaySettings.from_env(), Connections.from_env()
    kafka = ("kafka",) if {"enqueue", "fire", "scheduled"} & set(args.roles) else ()  # sweep: Postgres only
    broker = ("amqp",) if "scheduled" in args.roles else ()  # the relay publishes into the pools
    require("postgres", *kafka, *broker, connections=connections)
    local = runtime.LocalRuntime(settings, connections, roles=args.roles)
    stopped = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        show(f"switchyard delay: {signal.Signals(signum).name}, stopping", file=sys.stderr)
        stopped.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    local.start()
    show(f"switchyard delay: running {', '.join(local.roles)}: {settings.input_topic} -> "
         f"{settings.output_topic} (schema {settings.schema}); Ctrl-C to stop", file=sys.stderr)
    while not stopped.wait(0.5):
        if ended := local.ended():
            for role, why in ended.items():
                show(f"switchyard delay: error: the {role} loop ended: {why}; stopping", file=sys.stderr)
            local.join()
            return 1
    local.join()
    return 0


def _store() -> Any:
    """The delay service over its store, Postgres checked first."""
    connections = Connections.from_env()
    require("postgres", connections=connections)
    return build_service(DelaySettings.from_env(), connections)


def _migrate(args: argparse.Namespace) -> int:
    svc = _store()
    applied = svc.store.migrate()
    print(json.dumps({"schema": svc.settings.schema, "applied": applied}))
    svc.close()
    return 0


def _invoke(args: argparse.Namespace) -> int:
    ship_metrics("delay")
    event = read_event(args.event) if args.event else \
        runtime.scheduled_event(f"switchyard-delay-{args.handler}")
    require("postgres", *(("kafka",) if args.handler == "fire" else ()),
            *(("amqp",) if args.handler == "scheduled" else ()))
    name = runtime.FUNCTIONS[args.handler]
    result = invoke_handler(runtime.load_function(args.handler), name, event, args.event or "-",
                            FakeLambdaContext(name, args.timeout_ms))
    print(json.dumps(result, default=str))
    return 0


def _send(args: argparse.Namespace) -> int:
    settings, connections = DelaySettings.from_env(), Connections.from_env()
    topic = validate_topic(args.topic or settings.input_topic)
    require("kafka", connections=connections)
    if args.deadline:
        try:
            deadline = format_deadline(parse_deadline(args.deadline))
        except ValueError as exc:
            raise ConfigError(f"--deadline: {exc}") from exc
    else:
        deadline = format_deadline(datetime.now(UTC) + timedelta(milliseconds=args.delay_ms))
    message_id = args.id or str(uuid.uuid4())
    headers = [(MESSAGE_ID_HEADER, message_id.encode()), (DEADLINE_HEADER, deadline.encode())]
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--header must be NAME=VALUE, got {item!r}")
        headers.append((name, value.encode()))
    # log_level 0: librdkafka's own lines (%3|...|FAIL|...) stay off the terminal; a failure is
    # the delivery error below, as one line.
    producer = Producer({"bootstrap.servers": connections.kafka_bootstrap, "enable.idempotence": True,
                         "acks": "all", "message.timeout.ms": 10_000, "log_level": 0})
    errors: list[str] = []
    producer.produce(topic, key=args.key.encode() if args.key is not None else None,
                     value=args.value.encode() if args.value is not None else None, headers=headers,
                     on_delivery=lambda err, _msg: errors.append(err.str()) if err else None)
    if producer.flush(15) or errors:
        raise BrokerError(f"message {message_id} not confirmed by Kafka at {connections.kafka_bootstrap}: "
                          f"{'; '.join(errors) or 'no answer'}; check {KAFKA_BOOTSTRAP.name}")
    print(json.dumps({"topic": topic, "chronosMessageId": message_id, "chronosDeadline": deadline}))
    return 0


def _status(args: argparse.Namespace) -> int:
    from switchyard.cli.status import delay_lines
    from switchyard.delay.status import delay_status

    svc = _store()
    try:
        status = delay_status(svc.store)
    finally:
        svc.close()
    if args.json:
        print(json.dumps(status.to_dict()))
    else:
        show(*delay_lines(status))
    return 0


SHOWN_VALUE_CHARS = 200  # of a parked value, in the human listing (--json: all --value-bytes)


def _bytes_json(data: bytes | None) -> dict[str, Any] | None:
    """Bytes for JSON: as text (undecodable bytes replaced) and exactly, in base64."""
    if data is None:
        return None
    return {"text": data.decode("utf-8", "replace"), "base64": base64.b64encode(data).decode("ascii")}


def _bytes_shown(data: bytes | None, width: int = 0) -> str:
    return "(null)" if data is None else printable(data.decode("utf-8", "replace"), width)


def _parked_json(m: ParkedMessage) -> dict[str, Any]:
    return {"id": m.id, "deadline": m.deadline.isoformat(), "parked_at": m.parked_at.isoformat(),
            "bytes": m.size or 0, "reason": m.reason, "key": _bytes_json(m.key),
            "value": _bytes_json(m.value), "value_truncated": (m.size or 0) > len(m.value or b""),
            "headers": [{"name": name, "value": _bytes_json(value)} for name, value in m.headers]}


def _parked(args: argparse.Namespace) -> int:
    svc = _store()
    try:
        svc.store.migrate()
        rows = svc.store.parked(args.limit, args.value_bytes)
    finally:
        svc.close()
    if args.json:
        print(json.dumps([_parked_json(m) for m in rows]))
        return 0
    if not rows:
        show(f"no parked messages in schema {svc.settings.schema}")
        return 0
    lines = [f"{len(rows)} parked message(s) in schema {svc.settings.schema}, newest first "
             "(refused for good; fix the cause, then `switchyard delay replay`):"]
    for m in rows:
        lines += [f"  {m.id}  deadline {m.deadline.isoformat()}  parked {m.parked_at.isoformat()}  "
                  f"{m.size or 0} bytes  {m.reason}",
                  f"    key     {_bytes_shown(m.key)}",
                  f"    value   {_bytes_shown(m.value, SHOWN_VALUE_CHARS)}",
                  *(f"    header  {name}: {_bytes_shown(value)}" for name, value in m.headers)]
    show(*lines)
    return 0


def _replay(args: argparse.Namespace) -> int:
    svc = _store()
    try:
        svc.store.migrate()
        moved = svc.store.replay_parked(None if args.all else args.id, args.limit)
        left = svc.store.parked_count()
    finally:
        svc.close()
    asked = set(args.id or ())
    not_moved = sorted(asked - set(moved))
    if args.json:
        print(json.dumps({"replayed": moved, "not_replayed": not_moved, "parked_left": left}))
        return 0
    show(f"replayed {len(moved)} parked message(s) in schema {svc.settings.schema}: waiting again, "
         f"due now; {left} left parked")
    if not_moved:
        show(f"not replayed (not parked, or waiting again under a new message): {', '.join(not_moved)}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``delay`` and its subcommands to the ``switchyard`` command line."""
    delay = subparsers.add_parser(
        "delay", help="persistent delay scheduler (Chronos): Kafka in, Postgres underneath, Kafka out",
        description="Persistent delay scheduler. Configuration: SWITCHYARD_DELAY_* variables "
                    f"({docs_link('configuration.md')}).",
    )
    delay.set_defaults(func=lambda _args: delay.print_help() or 2)
    sub = add_commands(delay, "delay_command")

    run = sub.add_parser("run", help="local runtime: MSK bridge + ready/fire loop + failure sweep + "
                                     "the scheduled-call relay",
                         description="Run the scheduler continuously until Ctrl-C / SIGTERM.")
    run.add_argument("--roles", nargs="+", choices=list(runtime.FUNCTIONS), default=list(runtime.FUNCTIONS),
                     help="which loops this process runs (default: all four; scheduled relays fired "
                          "calls into their pools)")
    run.set_defaults(func=_run)

    migrate = sub.add_parser("migrate", help="create or upgrade the schema (idempotent)",
                             description=f"Apply the delay store's migrations to {DELAY['schema'].name}.")
    add_json_option(migrate, always=True)
    migrate.set_defaults(func=_migrate)

    invoke = sub.add_parser("invoke", help="invoke one Lambda handler with an event file",
                            description="Call functions/delay_HANDLER.py's lambda_handler once, locally.")
    invoke.add_argument("handler", choices=list(runtime.FUNCTIONS),
                        help="which handler: functions/delay_HANDLER.py (scheduled: the relay, "
                             "functions/rpc_scheduled.py)")
    invoke.add_argument("--event", help="JSON event file (default: an EventBridge scheduled event)")
    invoke.add_argument("--timeout-ms", type=COUNT, default=5000,
                        help="the fake context's remaining time; fire/sweep loop until it runs short")
    add_json_option(invoke, always=True)
    invoke.set_defaults(func=_invoke)

    send = sub.add_parser("send", help="publish a test message with Chronos headers",
                          description="Publish one message to the input topic (or --topic).")
    send.add_argument("--id", help="chronosMessageId (default: a random UUID)")
    when = send.add_mutually_exclusive_group()
    when.add_argument("--deadline", help="chronosDeadline, ISO-8601 (naive means UTC)")
    when.add_argument("--delay-ms", type=int, default=5000, help="deadline = now + this (default 5000)")
    send.add_argument("--key", help="the Kafka message key (default: none)")
    send.add_argument("--value", default="{}", help="the message value (default {})")
    send.add_argument("--header", action="append", default=[], metavar="NAME=VALUE", help="extra header")
    send.add_argument("--topic", help=f"default: {DELAY['input_topic'].name}")
    add_json_option(send, always=True)
    send.set_defaults(func=_send)

    status = sub.add_parser("status", help="waiting, ready, overdue and parked rows; the fire lateness",
                            description="Print the schema's figures: rows waiting and ready, the overdue "
                                        "backlog, parked messages, the earliest waiting deadline and the "
                                        "fire loops' lateness (p99 of the last 5 minutes).")
    add_json_option(status)
    status.set_defaults(func=_status)

    parked = sub.add_parser("parked", help="list messages refused for good (output broker, relay)",
                            description="Messages moved to parked_messages instead of being retried forever.")
    parked.add_argument("--limit", type=AT_LEAST_ONE, default=100, help="at most this many, newest first")
    parked.add_argument("--value-bytes", type=AT_LEAST_ONE, default=1024,
                        help="read at most this many bytes of each value (the listing shows 200 characters; "
                             "--json all of them)")
    add_json_option(parked)
    parked.set_defaults(func=_parked)

    replay = sub.add_parser("replay", help="send parked messages again, once their cause is fixed",
                            description="Move parked messages back to the waiting rows, due now: the fire "
                                        "loops publish them as they publish any due message (and park them "
                                        "again if the cause remains). A message whose id is waiting again "
                                        "under a new message stays parked.")
    which = replay.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", action="append", metavar="ID",
                       help="a parked message's id (repeatable; see `switchyard delay parked`)")
    which.add_argument("--all", action="store_true", help="every parked message, oldest first")
    replay.add_argument("--limit", type=AT_LEAST_ONE, default=10_000,
                        help="at most this many in one run, oldest first (default 10000)")
    add_json_option(replay)
    replay.set_defaults(func=_replay)
