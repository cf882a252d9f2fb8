"""``switchyard pool``, ``switchyard call`` and ``switchyard worker``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator, Mapping

from switchyard.cli.options import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    add_commands,
    add_json_option,
    at_time,
    show,
)
from switchyard.cli.preflight import require
from switchyard.core.errors import ConfigError
from switchyard.core.observability import redact_url
from switchyard.core.tracing import TRACEPARENT_HEADER, parse
from switchyard.rpc import protocol
from switchyard.rpc.client import RpcClient
from switchyard.rpc.client.schedule import collect
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.errors import CallError, CallTimeoutError
from switchyard.rpc.settings import (
    CALL_TIMEOUT,
    DELIVERY_LIMIT,
    KEY,
    POOL,
    QUEUE_TYPE,
    REQUEST_TTL,
    PoolPolicy,
    RpcSettings,
)
from switchyard.rpc.spares import SPARE_ENV
from switchyard.rpc.worker import WorkerConfig, run_worker


def _settings(args: argparse.Namespace) -> RpcSettings:
    settings = RpcSettings.from_env()
    overrides = {}
    if getattr(args, "queue_type", None):
        overrides["queue_type"] = protocol.QueueType(args.queue_type)
    if getattr(args, "ttl_ms", None):
        overrides["message_ttl_ms"] = args.ttl_ms
    if getattr(args, "delivery_limit", None):
        overrides["delivery_limit"] = args.delivery_limit
    if overrides:
        policy = PoolPolicy(**{**vars(settings.policy), **overrides})
        settings = RpcSettings(**{**vars(settings), "policy": policy})
    return settings


@contextlib.contextmanager
def _pool_topology(args: argparse.Namespace, *services: str) -> Iterator[tuple[RpcSettings, PoolTopology]]:
    """The pool's topology, once the broker (and ``services``) answer: what every ``pool`` command opens."""
    settings = _settings(args)
    require("amqp", "management", *services, connections=settings.connections)
    with PoolTopology(args.pool, settings) as topology:
        yield settings, topology


def _result(args: argparse.Namespace, data: dict[str, object], line: str) -> int:
    """Print a command's result: ``data`` as JSON with ``--json``, else ``line``."""
    if args.json:
        print(json.dumps(data))
    else:
        show(line)
    return 0


def cmd_pool_init(args: argparse.Namespace) -> int:
    with _pool_topology(args) as (settings, topology):
        topology.declare()
    policy = settings.policy
    return _result(args, {"pool": args.pool, "exchange": protocol.req_exchange(args.pool),
                          "queue_type": policy.queue_type.value, "ttl_ms": policy.message_ttl_ms,
                          "delivery_limit": policy.delivery_limit},
                   f"pool {args.pool!r} ready: exchange {protocol.req_exchange(args.pool)}, request queues "
                   f"{policy.queue_type.value}, ttl {policy.message_ttl_ms} ms, "
                   f"delivery limit {policy.delivery_limit}")


def cmd_pool_bind(args: argparse.Namespace) -> int:
    with _pool_topology(args) as (_, topology):
        topology.require()
        queue = topology.ensure_request_queue(args.key)
    return _result(args, {"queue": queue, "exchange": protocol.req_exchange(args.pool), "key": args.key},
                   f"queue {queue} bound to {protocol.req_exchange(args.pool)} by key {args.key!r}")


def cmd_pool_status(args: argparse.Namespace) -> int:
    from switchyard.cli.status import pool_lines
    from switchyard.core.redis_client import connect_redis
    from switchyard.rpc.status import pool_figures

    with _pool_topology(args, "redis") as (settings, topology):
        topology.require()
        figures = pool_figures(args.pool, connect_redis(settings.connections), topology.management)
    if args.json:
        print(json.dumps(figures.to_dict()))
        return 0
    show(*pool_lines(figures, time.time(), args.max_groups))
    return 0


def cmd_pool_delete(args: argparse.Namespace) -> int:
    from switchyard.core.redis_client import connect_redis
    from switchyard.rpc.store import PoolState

    with _pool_topology(args, "redis") as (settings, topology):
        queues = topology.own_queues()
        dropped = topology.delete(force=args.force)  # PoolNotEmptyError: one line from main, exit 1
    PoolState(connect_redis(settings.connections), args.pool).clear()
    return _result(args, {"pool": args.pool, "queues": len(queues), "dropped": dropped},
                   f"pool {args.pool!r} deleted ({len(queues)} queues, {dropped} messages dropped)")


def cmd_pool_poison(args: argparse.Namespace) -> int:
    """List the pool's set-aside requests, or (``--replay``) send them back under their keys."""
    from switchyard.rpc.control.poison import list_poison, replay_poison

    with _pool_topology(args) as (settings, topology):
        topology.require()
        if args.replay:
            outcome = replay_poison(settings, args.pool, args.limit)
            return _result(args, {"pool": args.pool, "replayed": outcome.replayed, "kept": outcome.kept,
                                  "keys": sorted(outcome.keys)},
                           f"replayed {outcome.replayed} request(s) of {protocol.poison_queue(args.pool)} "
                           f"to {len(outcome.keys)} key(s); {outcome.kept} kept in it (no key a worker "
                           "can carry)")
        messages = list_poison(settings, args.pool, args.limit)
    if args.json:
        print(json.dumps({"pool": args.pool, "messages": [vars(m) for m in messages]}))
        return 0
    if not messages:
        show(f"{protocol.poison_queue(args.pool)} is empty: nothing set aside")
        return 0
    show(f"{len(messages)} set aside in {protocol.poison_queue(args.pool)} (first {args.limit} at most; "
         f"replay them once the cause is fixed: switchyard pool poison -p {args.pool} --replay):",
         *(f"  key {m.key!r}  {m.size} bytes  correlation {m.correlation_id}  reason: {m.reason}"
           if m.key is not None else f"  (no key: stays)  {m.size} bytes  reason: {m.reason}"
           for m in messages))
    return 0


def cmd_schedule(args: argparse.Namespace, body: bytes) -> int:
    """``call --at``: schedule through the delay scheduler; print the call's id."""
    settings = RpcSettings.from_env()
    require("kafka", *(("amqp",) if args.reply_queue else ()), connections=settings.connections)
    with RpcClient(args.pool, settings, timeout=args.timeout) as client:
        call_id = client.schedule(args.key, body, at=args.at, reply=args.reply_queue,
                                  expiration_ms=args.expiration_ms).result(client.default_timeout)
    from switchyard.delay.settings import DelaySettings
    from switchyard.delay.status import runner_seen

    delay = DelaySettings.from_env()
    seen = runner_seen(settings.connections.kafka_bootstrap, delay.consumer_group)
    at = args.at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if args.json:
        print(json.dumps({"status": "scheduled", "id": call_id, "at": at, "reply_queue": args.reply_queue,
                          "topic": delay.input_topic, "runner_seen": seen}))
    else:
        where = f"; answer in reply queue {args.reply_queue}" if args.reply_queue else "; no answer kept"
        show(f"scheduled {call_id} at {at}: queued to Kafka topic {delay.input_topic} for the delay "
             f"scheduler{where}")
    if not seen:
        show(f"switchyard: warning: {'no' if seen is False else 'could not tell whether a'} delay runner "
             f"reads {delay.input_topic} (consumer group {delay.consumer_group}): the call waits in Kafka "
             "until one runs (switchyard delay run, or the deployed scheduler; switchyard delay status "
             "shows what it holds)", file=sys.stderr)
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    """The answers waiting in a durable reply queue (of ``--id``s, waiting up to ``--timeout``)."""
    settings = RpcSettings.from_env()
    require("amqp", connections=settings.connections)
    answers = collect(settings, args.reply_queue, args.id, args.timeout)
    if args.json:
        print(json.dumps([{"id": cid, "status": r.status, "body": r.text()} for cid, r in answers.items()]))
    else:
        show(*(f"{cid}  {response.status}  {response.text()}" for cid, response in answers.items()))
    missing = [cid for cid in args.id or () if cid not in answers]
    if missing:
        show(f"switchyard: {len(missing)} answer(s) not there yet: {', '.join(missing)}", file=sys.stderr)
    return 1 if missing else 0


def _control_plane_hint(pool: str) -> str:
    return f"switchyard local --pool {pool}, or deploy the pool's control plane"


def who_serves(pool: str, key: str, settings: RpcSettings) -> tuple[int | None, bool | None]:
    """The workers on ``key``'s request queue (None: the key has no queue: its requests go to the
    orphan queue), and whether a control plane consumes that (None: the pool is not initialized)."""
    with PoolTopology(pool, settings) as topology:
        queue = topology.queue_status(protocol.request_queue(pool, key))
        orphans = topology.queue_status(protocol.orphan_queue(pool))
    return (queue[1] if queue else None), (None if orphans is None else orphans[1] > 0)


def cmd_call(args: argparse.Namespace) -> int:
    body = sys.stdin.buffer.read() if args.body == "-" else args.body.encode()
    if args.at is not None:
        return cmd_schedule(args, body)
    if args.reply_queue is not None:
        raise ConfigError("--reply-queue goes with --at (a call now answers to this command)")
    settings = RpcSettings.from_env()
    require("amqp", connections=settings.connections)
    workers, control_plane = who_serves(args.pool, args.key, settings)
    if workers is None and control_plane is False:  # nothing can answer: say so now, not after the timeout
        key = shlex.quote(args.key)
        raise CallError(f"no group serves key {args.key!r} in pool {args.pool!r} and no control plane "
                        f"is running to start one: run {_control_plane_hint(args.pool)}; or bind the key "
                        f"and run a worker for it (switchyard pool bind -p {args.pool} -k {key}; "
                        f"switchyard worker -p {args.pool} -k {key} --handler module:function)")
    with RpcClient(args.pool, settings, timeout=args.timeout, confirm=args.confirm) as client:
        started = time.perf_counter()
        try:
            response = client.call(args.key, body, expiration_ms=args.expiration_ms)
        except CallTimeoutError as exc:
            workers, control_plane = who_serves(args.pool, args.key, settings)
            why = ("no group serves the key (it has no request queue)" if workers is None else
                   f"{workers} worker(s) on the key's queue")
            if not control_plane:
                why += f", and no control plane is running ({_control_plane_hint(args.pool)})"
            raise CallTimeoutError(f"{exc}: {why}") from exc
        elapsed = time.perf_counter() - started
    trace = parse(response.headers.get(TRACEPARENT_HEADER))  # the worker's span: `switchyard trace ID`
    trace_id = trace.trace_id if trace is not None else None
    if args.json:
        print(json.dumps({"status": response.status, "body": response.text(),
                          "latency_ms": round(elapsed * 1000, 3), "trace_id": trace_id}))
    else:
        traced = f" trace {trace_id}" if trace_id else ""
        show(f"status: {response.status} ({elapsed * 1000:.1f} ms){traced}")
        sys.stdout.write(response.text() + "\n")  # the answer itself, as the worker gave it (as curl would)
    return 0 if response.ok else 3


# ``switchyard worker`` flags and the WORKER_* variables they stand for (a flag wins; the worker
# group drivers keep setting the variables).
WORKER_FLAGS = {"pool": "WORKER_POOL", "key": "WORKER_KEY", "id": "WORKER_ID",
                "requests_queue": "WORKER_REQUESTS_QUEUE", "activity_exchange": "WORKER_ACTIVITY_EXCHANGE"}


def worker_env(args: argparse.Namespace, environ: Mapping[str, str], spare: bool = False) -> dict[str, str]:
    """The worker protocol's variables (every ``WORKER_*``: prefetch, queue wait, ...) with the flags
    given on top (passed on as values, never written back). A ``spare`` has no key yet."""
    env = {variable: value for variable, value in environ.items() if variable.startswith("WORKER_")}
    env.update({variable: value for flag, variable in WORKER_FLAGS.items()
                if (value := getattr(args, flag, None)) is not None})
    for variable, setting in (("WORKER_POOL", POOL), ("WORKER_KEY", KEY)):  # the documented names
        if variable not in env and (value := setting.raw()) is not None:
            env[variable] = value
    # "" is a key like any other (the protocol allows the empty key): only absence is missing
    if "WORKER_POOL" not in env or ("WORKER_KEY" not in env and not spare):
        raise ConfigError(f"a worker needs a pool and a key: give --pool and --key (or {POOL.name} and "
                          f"{KEY.name})")
    return env


def announce_worker(config: WorkerConfig, settings: RpcSettings, handler: str) -> None:
    """The worker's one start line (stderr): what it serves, with what, on which broker."""
    queue = "" if config.requests_queue == protocol.request_queue(config.pool, config.key) else \
        f", queue {config.requests_queue!r}"
    show(f"switchyard worker {config.worker_id}: pool {config.pool!r}, key {config.key!r}{queue}, handler "
         f"{handler}, broker {redact_url(settings.connections.amqp_url)}; SIGTERM or Ctrl-C to stop",
         file=sys.stderr, flush=True)


def cmd_worker(args: argparse.Namespace) -> int:
    # A warm spare (the drivers' WORKER_SPARE=1, no key: an ECS spare task runs this command).
    spare = os.environ.get(SPARE_ENV) == "1" and args.key is None and KEY.raw() is None
    env = worker_env(args, os.environ, spare=spare)
    if spare and "WORKER_KEY" not in env:
        from switchyard.rpc.worker.spare import run_spare

        show(f"switchyard worker {env.get('WORKER_ID', '')}: a spare of pool {env['WORKER_POOL']!r}, "
             f"handler {args.handler}, waiting for a key; SIGTERM or Ctrl-C to stop",
             file=sys.stderr, flush=True)
        stats = run_spare(args.handler, env=env)
    else:
        stats = run_worker(args.handler, env=env,
                           announce=lambda config, settings: announce_worker(config, settings, args.handler))
    show(f"worker stopped: {stats.handled} handled, {stats.errors} errors, {stats.requeued} requeued",
         file=sys.stderr)
    return 0


POOL_RULE = f"1-{protocol.MAX_POOL_NAME_CHARS} of A-Z a-z 0-9 _"


def _pool_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", required=True, help=f"pool name: {POOL_RULE}")


def register(subparsers: argparse._SubParsersAction) -> None:
    pool = subparsers.add_parser("pool", help="declare and inspect a pool's exchanges and queues")
    pool_sub = add_commands(pool, "pool_command", required=True)

    init = pool_sub.add_parser("init", help="declare a pool (idempotent; safe from several processes)")
    _pool_arg(init)
    init.add_argument("--queue-type", choices=[t.value for t in protocol.QueueType],
                      help=f"request queue type (default {QUEUE_TYPE.name} or quorum)")
    init.add_argument("--ttl-ms", type=AT_LEAST_ONE,
                      help=f"request TTL in ms (default {REQUEST_TTL.name})")
    init.add_argument("--delivery-limit", type=AT_LEAST_ONE,
                      help=f"deliveries before a request is dead-lettered (default {DELIVERY_LIMIT.name})")
    add_json_option(init)
    init.set_defaults(func=cmd_pool_init)

    bind = pool_sub.add_parser("bind", help="create a key's request queue and bind it (no worker needed)")
    _pool_arg(bind)
    bind.add_argument("--key", required=True, help="the worker key (any UTF-8 string)")
    add_json_option(bind)
    bind.set_defaults(func=cmd_pool_bind)

    delete = pool_sub.add_parser("delete", help="delete a pool's queues, exchanges, policies and state")
    _pool_arg(delete)
    delete.add_argument("--force", action="store_true", help="delete even if queues still hold messages")
    add_json_option(delete)
    delete.set_defaults(func=cmd_pool_delete)

    poison = pool_sub.add_parser("poison", help="list the requests set aside in the pool's poison queue, "
                                                "or send them back under their keys (--replay)")
    _pool_arg(poison)
    poison.add_argument("--replay", action="store_true",
                        help="send them back to the pool's request exchange once the cause is fixed "
                             "(each acknowledged only after the broker confirmed its copy)")
    poison.add_argument("--limit", type=AT_LEAST_ONE, default=100,
                        help="messages read (default 100)")
    add_json_option(poison)
    poison.set_defaults(func=cmd_pool_poison)

    status = pool_sub.add_parser("status", help="the pool's worker groups (state, workers, backlog, last "
                                                "activity), its orphan, dead-letter and poison queues")
    _pool_arg(status)
    status.add_argument("--max-groups", type=AT_LEAST_ONE, default=20,
                        help="groups listed (default 20; --json lists all)")
    add_json_option(status)
    status.set_defaults(func=cmd_pool_status)

    call = subparsers.add_parser("call", help="send one request and print the response")
    _pool_arg(call)
    call.add_argument("--key", required=True, help="the worker key (any UTF-8 string)")
    call.add_argument("--body", default="", help="request body; '-' reads standard input")
    call.add_argument("--timeout", type=POSITIVE, default=None,
                      help=f"seconds to wait (default {CALL_TIMEOUT.name})")
    call.add_argument("--expiration-ms", type=AT_LEAST_ONE, default=None,
                      help="request TTL (default: the timeout)")
    call.add_argument("--confirm", action="store_true", help="use publisher confirms")
    call.add_argument("--at", type=at_time, metavar="TIME",
                      help="schedule the call instead (through the delay scheduler): an ISO-8601 date-time "
                           "(UTC unless it has an offset), now, or +5s / +500ms / +2m / +1h from now; a "
                           "past time runs at once. Prints the call's id; no answer unless --reply-queue")
    call.add_argument("--reply-queue", metavar="NAME",
                      help="with --at: keep the answer in the durable reply queue switchyard-reply-NAME "
                           "(read it with switchyard collect)")
    add_json_option(call)
    call.set_defaults(func=cmd_call)

    collect_cmd = subparsers.add_parser(
        "collect", help="read the answers of scheduled calls from a durable reply queue",
        description="Take the answers waiting in switchyard-reply-NAME (by call id with --id); they leave "
                    "the queue. Exit 1 if an --id has no answer within --timeout.")
    collect_cmd.add_argument("--reply-queue", metavar="NAME", required=True,
                             help="the reply queue's name, as given to call --at --reply-queue")
    collect_cmd.add_argument("--id", action="append", metavar="ID",
                             help="a call id to wait for (repeat it); default every answer there now")
    collect_cmd.add_argument("--timeout", type=NON_NEGATIVE, default=0.0,
                             help="seconds to wait for the --id answers (default 0: what is there)")
    add_json_option(collect_cmd)
    collect_cmd.set_defaults(func=cmd_collect)

    worker = subparsers.add_parser(
        "worker", help="run a worker: serve one key's requests with a handler until SIGTERM",
        description="Run a worker. Each flag may instead come from its variable (the worker group "
                    "drivers set the WORKER_* ones); a flag wins over its variable. It prints one line to "
                    "stderr when it starts: what it serves, with which handler, on which broker.")
    worker.add_argument("--handler", required=True,
                        help="module:function taking a Request, e.g. switchyard.rpc.examples:echo")
    worker.add_argument("--pool", help=f"pool name ({POOL.name}; WORKER_POOL): {POOL_RULE}")
    worker.add_argument("--key", help=f"the key this worker serves ({KEY.name}; WORKER_KEY)")
    worker.add_argument("--id", help="this worker's id in replies and activity events "
                                     "(WORKER_ID; default host-pid-random)")
    worker.add_argument("--requests-queue", metavar="QUEUE",
                        help="queue to consume (WORKER_REQUESTS_QUEUE; default the key's request queue)")
    worker.add_argument("--activity-exchange", metavar="EXCHANGE",
                        help="where activity events go (WORKER_ACTIVITY_EXCHANGE; default the pool's)")
    worker.set_defaults(func=cmd_worker)
