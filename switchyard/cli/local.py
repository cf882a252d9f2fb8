"""``switchyard local`` (the control plane of a pool, locally) and ``switchyard invoke``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from switchyard.cli.options import COUNT, NON_NEGATIVE, POSITIVE, add_stack_option, show
from switchyard.cli.preflight import require
from switchyard.core.errors import ConfigError
from switchyard.local.functions import HANDLERS, SAMPLE_EVENT, SAMPLE_EVENTS_DIR, load_function
from switchyard.local.lambda_context import FakeLambdaContext
from switchyard.rpc.settings import STOP_DELAY, UNBIND_DELAY

if TYPE_CHECKING:
    from switchyard.rpc.settings import ControlSettings


def quiet_metrics(service: str | None = None) -> None:
    """Locally nothing reads stdout: with ``SWITCHYARD_SHIP_METRICS=1`` the handlers' metrics go to
    CloudWatch under ``service`` (the deployed functions' dimension); otherwise EMF blobs would
    flood the terminal, so they are off unless the user turned them on."""
    from switchyard.local.metrics_shipper import ship_if_enabled  # Powertools: only when it runs

    if ship_if_enabled(service) is None:
        os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")


def control_settings(pool: str, unbind_delay: float | None = None,
                     stop_delay: float | None = None) -> ControlSettings:
    """The pool's control settings: the environment's (``SWITCHYARD_*``), with the command's
    flags passed as values on top (never written back into the environment for it to read)."""
    from switchyard.rpc.settings import ControlSettings

    control = ControlSettings.from_env(pool=pool)
    delays = control.delays
    if unbind_delay is not None:
        delays = replace(delays, unbind_s=unbind_delay)
    if stop_delay is not None:
        delays = replace(delays, stop_s=stop_delay)
    return replace(control, delays=delays)


WORKERS = {True: "workers running", False: "no workers"}  # the --status-every line: key: state, workers


def cmd_local(args: argparse.Namespace) -> int:
    from switchyard.core.observability import pool_service

    quiet_metrics(pool_service(args.pool))
    from switchyard.core.tracing import enable_trace_log
    from switchyard.local.rpc_runtime import LocalControlPlane

    enable_trace_log()  # before the driver copies the environment its workers get

    control = control_settings(args.pool, args.unbind_delay, args.stop_delay)
    require("amqp", "management", "redis")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with LocalControlPlane(control) as runtime:
        show(f"control plane of pool {control.pool!r} running (unbind after {control.delays.unbind_s:g} s, "
             f"stop after {control.delays.stop_s:g} s); Ctrl-C to stop", flush=True)
        due = time.monotonic() + args.status_every
        while not stop.wait(min(0.5, args.status_every)):
            if ended := runtime.ended():
                show(f"error: control plane of pool {control.pool!r}: {', '.join(ended)} ended (see the "
                     "error above); stopping", file=sys.stderr)
                return 1
            if time.monotonic() < due:
                continue
            due += args.status_every
            groups = runtime.plane.state.groups()
            running = runtime.driver.list_running(control.pool)
            summary = "; ".join(f"{k!r}: {g.status.value}, {WORKERS[k in running]}"
                                for k, g in sorted(groups.items())) or "no groups"
            show(f"{time.strftime('%H:%M:%S')} {summary}", flush=True)
    show("stopped: workers terminated, batches settled")
    return 0


CONTROL_PLANE_FUNCTIONS = frozenset({"rpc_activity", "rpc_dead_letters", "rpc_orphans", "rpc_reconcile"})


def cmd_invoke(args: argparse.Namespace) -> int:
    name = args.function.removesuffix(".py")
    from switchyard.local.metrics_shipper import service_for_function

    quiet_metrics(service_for_function(name))
    if name not in HANDLERS:
        raise ConfigError(f"no function {name!r}; available: {', '.join(sorted(HANDLERS))}")
    path = args.event or sample_event(name)
    event = read_event(path)
    if name in CONTROL_PLANE_FUNCTIONS:  # locally, workers it starts run the demo handler if none is set
        from switchyard.aws import services
        from switchyard.local.rpc_runtime import local_plane

        services.control_plane.install(local_plane())
    result = invoke_handler(load_function(name), name, event, path,
                            FakeLambdaContext(name, args.timeout_ms))
    json.dump(result, sys.stdout, indent=2, default=str)
    print()
    return 0


def _raised_by_event_wrapper(exc: BaseException) -> bool:
    """Whether ``exc`` came from Powertools' event data class (reading the event), not the work."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and "data_classes" in Path(tb.tb_frame.f_code.co_filename).parts


SAMPLE_EVENTS = frozenset(p.name for p in SAMPLE_EVENTS_DIR.glob("*.json"))


def sample_event(name: str) -> str:
    """The path of ``name``'s sample event (shipped with the package), for an invoke without --event."""
    if name not in SAMPLE_EVENT:
        raise ConfigError(f"{name} has no sample event: pass --event FILE")
    return str(SAMPLE_EVENTS_DIR / SAMPLE_EVENT[name])


def read_event(path: str) -> dict[str, Any]:
    """The JSON object in the event file ``path``; a ConfigError that says why not."""
    try:
        event = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"cannot read event file {path}: {exc}") from exc
    if not isinstance(event, dict):
        raise ConfigError(f"event file {path} must hold a JSON object, not {type(event).__name__}")
    return event


def invoke_handler(module: Any, name: str, event: dict[str, Any], path: str, context: Any) -> Any:
    """``module.lambda_handler(event, context)``; an event without a field the handler reads is the
    user's file, not a bug: say which field and where the samples are."""
    try:
        return module.lambda_handler(event, context)
    except KeyError as exc:
        field = exc.args[0] if exc.args else None
        if not isinstance(field, str) or field in event or not _raised_by_event_wrapper(exc):
            raise
        raise ConfigError(f"event file {path} has no {field!r}: it is not the event {name} takes; "
                          f"start from a sample in {SAMPLE_EVENTS_DIR} "
                          f"({', '.join(sorted(SAMPLE_EVENTS))})") from exc


def register(subparsers: argparse._SubParsersAction) -> None:
    local = subparsers.add_parser(
        "local", help="run a pool's control plane locally (orphans, dead letters, activity, reconciler)")
    local.add_argument("--pool", required=True, help="the pool to manage (declared if missing)")
    local.add_argument("--unbind-delay", type=NON_NEGATIVE,
                       help=f"seconds idle before unbinding ({UNBIND_DELAY.name})")
    local.add_argument("--stop-delay", type=NON_NEGATIVE,
                       help=f"seconds unbound before stopping ({STOP_DELAY.name})")
    local.add_argument("--status-every", type=POSITIVE, default=5.0,
                       help="print the groups every N seconds (key: state, whether its workers run; "
                            "switchyard status shows more)")
    add_stack_option(local)
    local.set_defaults(func=cmd_local)

    invoke = subparsers.add_parser("invoke", help="call one Lambda handler (functions/NAME.py) with an event")
    invoke.add_argument("function",
                        help="e.g. rpc_orphans, rpc_dead_letters, rpc_activity, rpc_reconcile")
    invoke.add_argument("-e", "--event",
                        help="JSON event file (default: the function's sample event, in the package)")
    invoke.add_argument("--timeout-ms", type=COUNT, default=60_000, help="the fake context's time budget")
    invoke.set_defaults(func=cmd_invoke)
