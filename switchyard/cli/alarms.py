"""``switchyard alarms``: the deployed alarms' states, and a scenario that must trip two of them.

Run against a deployed stack (``switchyard --stack SwitchyardLocal alarms scenario``, which
``./dev localstack`` does after deploying the ``localstack`` target). The traffic is real and goes
through the local runtime, whose metrics the shipper sends to CloudWatch, where the deployed
alarms evaluate them:

1. calm: good calls on the pool and a delay fire run that keeps up; no watched alarm may trip;
2. trip: a poison request (its worker dies on it until the delivery limit dead-letters it) and a
   delay backlog left unfired (an invocation with no time to fire counts it as overdue);
3. recover: the fire loop catches up; the overdue alarm must return to OK.

A table shows each alarm's state after every phase.

Runs on one stack take turns: its alarms watch metrics that every run on it shares (the stack's
namespace, services ``switchyard-{pool}`` and ``switchyard-delay``), so a second run at once would
mix their states. A run waits for the one before (a lock per stack and CloudWatch endpoint), starts calm only
once no watched alarm is in ALARM, calls keys of its own (``calm-RUN``, ``poison-RUN``), and removes
what it made: their request queues and pool state, and its poison requests from ``{pool}-poison``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from switchyard.cli.options import add_commands, add_json_option, add_stack_option, show
from switchyard.core.deployed_config import ALARM_PREFIX_ENV
from switchyard.core.errors import ConfigError, SwitchyardError
from switchyard.core.settings import ALARM_PREFIX, LOG_LEVEL

if TYPE_CHECKING:
    from switchyard.rpc.worker import Request

OK, ALARM = "OK", "ALARM"
POISON_PREFIX = "poison-"  # a run's poison key: ``poison-RUN``


def alarm_prefix() -> str:
    """The deployed stack's alarm name prefix (``SWITCHYARD_ALARM_PREFIX``, from its configuration):
    alarm names start with the stack's name (two stacks in one account share none)."""
    prefix = ALARM_PREFIX.read()
    if not prefix:
        raise ConfigError(f"{ALARM_PREFIX_ENV} is not set: name the deployed stack with --stack NAME "
                          "(its configuration says how its alarms are named)")
    return prefix


def poison_alarm(pool: str) -> str:
    return f"{alarm_prefix()}{pool}-poison-growing"


def overdue_alarm() -> str:
    return f"{alarm_prefix()}delay-messages-overdue"


@contextlib.contextmanager
def taking_turns(client: Any, out: Callable[[str], None]) -> Iterator[None]:
    """Hold the stack's scenario lock (one per alarm prefix and CloudWatch endpoint) for the run."""
    where = f"{alarm_prefix()}|{client.meta.endpoint_url}"
    path = os.path.join(tempfile.gettempdir(),
                        f"switchyard-alarm-scenario-{hashlib.sha256(where.encode()).hexdigest()[:16]}.lock")
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out(f"waiting for the alarm scenario running on this stack ({path})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def scenario_worker(request: Request) -> bytes | str:
    """The scenario's workers: a request on a run's poison key kills its worker (``examples.crash``)."""
    from switchyard.rpc.examples import crash, describe

    return crash(request) if request.key.startswith(POISON_PREFIX) else describe(request)


class ScenarioFailed(SwitchyardError):
    """An alarm did not reach the state the scenario needs; the table says which."""


def cloudwatch() -> Any:
    """CloudWatch at the configured endpoint (``AWS_ENDPOINT_URL_CLOUDWATCH`` or ``AWS_ENDPOINT_URL``)."""
    from switchyard.local.metrics_shipper import cloudwatch_client

    return cloudwatch_client()


def alarm_states(client: Any, prefix: str | None = None) -> dict[str, str]:
    """Every metric alarm whose name starts with ``prefix`` (default: the stack's): name -> state."""
    states: dict[str, str] = {}
    for page in client.get_paginator("describe_alarms").paginate(AlarmNamePrefix=prefix or alarm_prefix(),
                                                                 AlarmTypes=["MetricAlarm"]):
        states.update({a["AlarmName"]: a["StateValue"] for a in page["MetricAlarms"]})
    return states


def wait_for_states(client: Any, wanted: dict[str, Callable[[str], bool]], timeout_s: float,
                    tick: Callable[[], None] | None = None, interval_s: float = 5.0) -> dict[str, str]:
    """Poll until every alarm in ``wanted`` satisfies its predicate, or ``timeout_s`` passes.

    ``tick`` runs before each poll: the traffic goes on while the alarms evaluate, as a schedule
    invokes the fire handler every minute on AWS (an alarm over two periods needs two datapoints).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if tick is not None:
            tick()
        states = alarm_states(client)
        if all(ok(states.get(name, "MISSING")) for name, ok in wanted.items()):
            return states
        if time.monotonic() >= deadline:
            return states
        time.sleep(interval_s)


@dataclass
class Table:
    """Alarm states per phase, printed as one readable table."""

    phases: list[str] = field(default_factory=list)
    states: dict[str, list[str]] = field(default_factory=dict)

    def add(self, phase: str, states: dict[str, str]) -> None:
        self.phases.append(phase)
        for name in sorted(set(self.states) | set(states)):
            column = self.states.setdefault(name, ["-"] * (len(self.phases) - 1))
            column.append(states.get(name, "-"))

    def render(self, watched: Sequence[str] = ()) -> list[str]:
        width = max([len(n) for n in self.states] + [5]) + 2
        lines = ["  " + "alarm".ljust(width) + "".join(p.ljust(19) for p in self.phases)]
        for name, column in sorted(self.states.items()):
            mark = "*" if name in watched else " "
            lines.append(f"{mark} {name.ljust(width)}" + "".join(s.ljust(19) for s in column))
        lines.append("  (* watched by the scenario)")
        return lines


# -- traffic ------------------------------------------------------------------------------------
def rpc_traffic(pool: str, run: str, good_calls: int, poison_calls: int, out: Callable[[str], None]) -> None:
    """Good calls, then ``poison_calls`` requests whose worker dies, through the local control plane."""
    from switchyard.core.observability import metrics, pool_service
    from switchyard.local.rpc_runtime import LocalControlPlane
    from switchyard.rpc import protocol
    from switchyard.rpc.client import RpcClient
    from switchyard.rpc.drivers import SubprocessDriver
    from switchyard.rpc.settings import ControlSettings, Delays, RpcSettings

    metrics.service = pool_service(pool)  # the dimension the pool's alarms select on
    settings = RpcSettings.from_env()
    driver = SubprocessDriver((sys.executable, "-m", "switchyard", "worker", "--handler",
                               f"{__name__}:scenario_worker"),
                              min_workers=1, max_workers=1, stop_timeout=5,
                              env={LOG_LEVEL.name: "ERROR"})
    control = ControlSettings(pool, Delays(unbind_s=60, stop_s=60), reconcile_interval_s=0.3)
    with LocalControlPlane(control, settings, driver), \
            RpcClient(pool, settings, concurrency=64, timeout=120) as client:
        answers = [client.submit(f"calm-{run}", f"call {i}") for i in range(good_calls)]
        ok = sum(f.result(130).ok for f in answers)
        out(f"  {ok}/{good_calls} good calls answered")
        if poison_calls:
            poisoned = [client.submit(POISON_PREFIX + run, f"crash {run} {i}") for i in range(poison_calls)]
            statuses = [f.result(130).status for f in poisoned]
            limited = statuses.count(protocol.Status.DELIVERY_LIMIT)
            out(f"  {limited}/{poison_calls} poison requests dead-lettered at the delivery limit "
                f"({settings.policy.delivery_limit} deliveries each)")
            if limited != poison_calls:
                raise ScenarioFailed(f"poison requests ended as {statuses}, "
                                     f"not {protocol.Status.DELIVERY_LIMIT}")


def remove_rpc_traffic(pool: str, run: str, out: Callable[[str], None]) -> None:
    """Delete the run's request queues and pool state, and take its poison requests out of the
    pool's poison inventory (other messages there go back as they were)."""
    import pika

    from switchyard.core.redis_client import connect_redis
    from switchyard.rpc import protocol
    from switchyard.rpc.amqp import connect
    from switchyard.rpc.control.topology import PoolTopology
    from switchyard.rpc.settings import RpcSettings
    from switchyard.rpc.store import PoolState

    settings = RpcSettings.from_env()
    keys = (f"calm-{run}", POISON_PREFIX + run)
    with PoolTopology(pool, settings) as topology:
        for key in keys:
            topology.delete_request_queue(key)
    state = PoolState(connect_redis(settings.connections), pool)
    for key in keys:
        group = state.get(key)
        if group is not None:
            state.remove(group)
    connection = connect(settings.connections.amqp_url, "switchyard-alarm-scenario-cleanup")
    removed = 0
    try:
        channel = connection.channel()
        waiting = channel.queue_declare(protocol.poison_queue(pool), passive=True).method.message_count
        for _ in range(waiting):
            method, _props, body = channel.basic_get(protocol.poison_queue(pool))
            if method is None:
                break
            if body.startswith(f"crash {run} ".encode()):
                channel.basic_ack(method.delivery_tag)
                removed += 1
        # The others, unacked, go back to the queue when the connection closes.
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            connection.close()
    out(f"  removed: request queues and state of {', '.join(keys)}; {removed} poison request(s)")


def delay_fire(backlog: int, budget_ms: int, out: Callable[[str], None]) -> int:
    """Leave ``backlog`` rows overdue (deadline 5 min ago), then invoke the fire handler with
    ``budget_ms`` of time: 0 leaves them unfired (counted overdue), a few seconds fires them."""
    from switchyard.aws.services import delay as delay_service
    from switchyard.core.observability import DELAY_SERVICE, metrics
    from switchyard.delay.model import DelayedMessage
    from switchyard.local.functions import load_function, scheduled_event
    from switchyard.local.lambda_context import FakeLambdaContext

    metrics.service = DELAY_SERVICE
    service = delay_service()
    service.store.migrate()
    if backlog:
        due = datetime.now(UTC) - timedelta(minutes=5)
        service.store.insert([DelayedMessage(f"alarm-scenario-{uuid.uuid4()}", due, None, b"{}", ())
                              for _ in range(backlog)])
    result = load_function("delay_fire").lambda_handler(scheduled_event("delay-fire"),
                                                       FakeLambdaContext("delay_fire", budget_ms))
    out(f"  delay fire ({budget_ms} ms): fired {result['fired']}, overdue at the end {result['overdue']}")
    return int(result["overdue"])


# -- the scenario -------------------------------------------------------------------------------
def run_scenario(pool: str, *, poison_calls: int = 1, backlog: int = 20, timeout_s: float = 120.0,
                 out: Callable[[str], None] = show) -> Table:
    """Calm, trip, recover; raises ``ScenarioFailed`` when an alarm misbehaves (after the table)."""
    from switchyard.local.metrics_shipper import install_metrics_shipper, uninstall_metrics_shipper

    client = cloudwatch()
    overdue = overdue_alarm()
    watched = (poison_alarm(pool), overdue)
    before = alarm_states(client)
    missing = [name for name in watched if name not in before]
    if missing:
        raise ConfigError(f"the stack has no alarm {', '.join(missing)}: deploy the localstack target "
                          f"(./dev localstack) with pool {pool!r} in switchyard:pools")
    table = Table()
    table.add("before", before)
    from switchyard.delay.settings import DelaySettings

    catch_up_ms = DelaySettings.from_env().stop_margin_ms + 1500  # time to step, beyond the stop margin
    shipper = install_metrics_shipper()

    printed = [""]

    def when_changed(line: str) -> None:  # a tick that fired what the last one did says nothing new
        if line != printed[0]:
            printed[0] = line
            out(line)

    def fire(backlog_rows: int, budget_ms: int) -> Callable[[], None]:
        def tick() -> None:
            delay_fire(backlog_rows, budget_ms, when_changed)
            shipper.flush()
        return tick

    run = uuid.uuid4().hex[:8]
    out(f"run {run}: keys calm-{run} and {POISON_PREFIX}{run}")
    try:
        out("1. calm: good calls, and a fire loop that keeps up")
        rpc_traffic(pool, run, good_calls=50, poison_calls=0, out=out)
        # A run before this one may have left an alarm in ALARM: calm means none is.
        calm = wait_for_states(client, {overdue: lambda s: s == OK,
                                        poison_alarm(pool): lambda s: s != ALARM},
                               timeout_s=timeout_s, tick=fire(0, catch_up_ms))
        table.add("calm", calm)
        out(f"2. trip: {poison_calls} poison request(s), {backlog} delayed messages left unfired")
        rpc_traffic(pool, run, good_calls=10, poison_calls=poison_calls, out=out)
        delay_fire(backlog, 0, out)
        tripped = wait_for_states(client, {n: lambda s: s == ALARM for n in watched}, timeout_s=timeout_s,
                                  tick=fire(0, 0))
        table.add("tripped", tripped)
        out("3. recover: the fire loop catches up")
        recovered = wait_for_states(client, {overdue: lambda s: s == OK}, timeout_s=timeout_s,
                                    tick=fire(0, catch_up_ms))
        table.add("recovered", recovered)
    finally:
        remove_rpc_traffic(pool, run, out)
        stats = uninstall_metrics_shipper()
        if stats is not None:
            out(stats.line())
    for line in table.render(watched):
        out(line)
    problems = [f"{name} was ALARM while calm" for name in watched if calm.get(name) == ALARM]
    problems += [f"{name} did not go to ALARM" for name in watched if tripped.get(name) != ALARM]
    if recovered.get(overdue) != OK:
        problems.append(f"{overdue} did not return to OK")
    if problems:
        raise ScenarioFailed("; ".join(problems))
    return table


def cmd_show(args: argparse.Namespace) -> int:
    states = alarm_states(cloudwatch())
    if args.json:
        print(json.dumps(dict(sorted(states.items()))))  # alarm name -> OK | ALARM | INSUFFICIENT_DATA
        return 0
    table = Table()
    table.add("state", states)
    show(*table.render())
    return 0


def cmd_scenario(args: argparse.Namespace) -> int:
    with taking_turns(cloudwatch(), show):
        run_scenario(args.pool, poison_calls=args.poison, backlog=args.backlog, timeout_s=args.timeout)
    show("scenario passed: the watched alarms stayed calm, tripped and recovered")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    defaults = argparse.ArgumentDefaultsHelpFormatter
    alarms = subparsers.add_parser(
        "alarms", help="the deployed alarms: their states, and a scenario that trips them (with --stack)")
    sub = add_commands(alarms, "alarms_command", required=True)
    show = sub.add_parser("show", help="print every Switchyard alarm and its state")
    add_stack_option(show)
    add_json_option(show)
    show.set_defaults(func=cmd_show)
    scenario = sub.add_parser(
        "scenario", formatter_class=defaults,
        help="calm traffic, then poison and an overdue backlog: the watched alarms trip, then recover")
    scenario.add_argument("--pool", default="core", help="a pool of the stack's switchyard:pools")
    scenario.add_argument("--poison", type=int, default=1, help="poison requests to send")
    scenario.add_argument("--backlog", type=int, default=20, help="delayed messages left overdue")
    scenario.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each change")
    add_stack_option(scenario)
    scenario.set_defaults(func=cmd_scenario, ships_metrics=True)
