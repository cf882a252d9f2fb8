"""The rpc part's settings from the environment (documented in docs/configuration.md).

The client's and worker's (``RpcSettings``, ``PoolPolicy``), the control plane's (``ControlSettings``)
and the worker group driver's (``DriverSettings``; the ECS driver's ``SWITCHYARD_RPC_ECS_*``, read by
``switchyard.rpc.drivers.ecs.EcsSettings.from_env``).
The worker protocol's own ``WORKER_*`` variables are read by ``worker.WorkerConfig``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from switchyard.core.config import AMQP_HEARTBEAT, Connections, Setting, build, config_source
from switchyard.core.errors import ConfigError
from switchyard.rpc import protocol
from switchyard.rpc.protocol import QueueType

# The handler local runs (``switchyard local``, the demos) give their workers when none is set; a
# deployed or production control plane has no default: a worker answering with a demo is no answer.
DEMO_HANDLER = "switchyard.rpc.examples:describe"
DRIVERS = ("subprocess", "noop", "ecs")
DEFAULT_WORKER_LOG_DIR = ".local/logs/workers"


def _rpc(name: str, default: object, doc: str, unit: str = "", **more: Any) -> Setting[Any]:
    """An rpc setting: ``SWITCHYARD_RPC_<NAME>[_<UNIT>]``, read under its old name too (with a warning)."""
    suffix = f"_{unit.upper()}" if unit and not name.endswith(f"_{unit.upper()}") else ""
    return Setting(f"SWITCHYARD_RPC_{name}{suffix}", default, doc, unit=unit, old=(f"SWITCHYARD_{name}",),
                   **more)


QUEUE_TYPE = _rpc("QUEUE_TYPE", QueueType.QUORUM.value,
                  "request and pool queue type: `quorum` (production) or `classic` (development)",
                  choices=tuple(t.value for t in QueueType))
REQUEST_TTL = _rpc("REQUEST_TTL_MS", 300_000,
                   "request queue message TTL (policy); expired requests are answered `expired`", unit="ms")
DELIVERY_LIMIT = _rpc("DELIVERY_LIMIT", 5,
                      "deliveries before a request is dead-lettered as `delivery_limit` (quorum)")
POLICY_PRIORITY = _rpc("POLICY_PRIORITY", 10, "priority of Switchyard's policies, above Amazon MQ's defaults")
QUORUM_INITIAL_GROUP_SIZE = _rpc(
    "QUORUM_INITIAL_GROUP_SIZE", 3,
    "members of each new quorum queue (`x-quorum-initial-group-size`; a broker of fewer nodes gives it one "
    "per node): one per node of Amazon MQ's three-node cluster. Its leader goes to the node leading the "
    "fewest (`x-queue-leader-locator: balanced`), not to the node Switchyard's connection reached. Both "
    "are fixed when a queue is created: queues made before keep their members and leader, and are used as "
    "they are")
CLIENT_CONCURRENCY = _rpc("CLIENT_CONCURRENCY", 64, "slots of an `RpcClient` (calls in flight)")
# A call's default timeout, and with it its request's expiration. 30 s locally (a subprocess worker
# starts in about a second); a deployment writes its own into the stack's configuration, long
# enough for a new key's first call to wait for a Fargate task (docs/deployment.md, "A new key's first call").
CALL_TIMEOUT = _rpc(
    "CALL_TIMEOUT", 30.0,
    "seconds a call waits by default; also its default expiration (a deployment sets 120 in its "
    "configuration: `switchyard:callTimeoutSeconds`)", unit="s")
WORKER_PREFETCH = _rpc("WORKER_PREFETCH", 4,
                       "requests a worker takes ahead (the worker's `WORKER_PREFETCH` wins)")
WORKER_ACK_DELAY = _rpc(
    "WORKER_ACK_DELAY_MS", 5.0,
    "the longest an answered request waits for its ack: a worker acks a few answers at once (one per "
    "prefetch - 1 when calls come one at a time, one per run when they queue), which spares a quorum queue "
    "a log write per request; a crash redelivers what was not acked yet (done twice, never lost). `0`: each "
    "at once (the worker's `WORKER_ACK_DELAY_MS` wins)", unit="ms")
ACTIVITY_INTERVAL = _rpc(
    "ACTIVITY_INTERVAL", 1.0,
    "at most one `request-received` report per this many seconds (`0`: every request; the worker's "
    "`WORKER_ACTIVITY_INTERVAL` wins)", unit="s")
POOL = _rpc("POOL", "", "the pool a control plane (Lambda functions) manages and `switchyard worker` "
            "serves; `switchyard local --pool` and `switchyard worker --pool` name their own (a worker also "
            "reads `WORKER_POOL`, which the worker group drivers set)")
KEY = Setting("SWITCHYARD_RPC_KEY", "", "the key `switchyard worker` serves (`--key` wins; a worker also "
              "reads `WORKER_KEY`, which the worker group drivers set)")
UNBIND_DELAY = _rpc("UNBIND_DELAY", 300.0, "seconds without orphan or activity before a group's queue is "
                    "unbound (`switchyard local --unbind-delay` wins)", unit="s")
STOP_DELAY = _rpc("STOP_DELAY", 600.0, "seconds unbound (and idle) before the group stops and its queue is "
                  "deleted (`switchyard local --stop-delay` wins)", unit="s")
TOMBSTONE_TTL = _rpc("TOMBSTONE_TTL", 3600.0, "seconds a stopped group is remembered, so late activity "
                     "reports cannot start it again", unit="s")
RECONCILE_INTERVAL = _rpc("RECONCILE_INTERVAL", 1.0, "seconds between reconciler passes in the local runtime",
                          unit="s")
DEAD_LETTER_PROBE_INTERVAL = _rpc(
    "DEAD_LETTER_PROBE_INTERVAL", 240.0,
    "seconds between probes of the broker's at-least-once dead-lettering (one probe per broker, whichever "
    "pool's reconciler takes the turn; `0`: never). See [delivery guarantees]"
    "(operations.md#delivery-guarantees-and-rabbitmqs-dead-letter-trap)", unit="s")
DEAD_LETTER_PROBE_VHOST = _rpc(
    "DEAD_LETTER_PROBE_VHOST", "",
    "where the reconciler runs that probe: a vhost of its own (the deployment sets "
    "`switchyard-dead-letter-probe`), so no pool's user needs `policymaker`. Unset: with the reconciler's "
    "own connection")
DEAD_LETTER_PROBE_SECRET_ARN = _rpc(
    "DEAD_LETTER_PROBE_SECRET_ARN", "",
    "the probe user's secret, with which the reconciler runs that probe in its vhost (the deployment sets "
    "it)")
DRIVER = _rpc("DRIVER", "subprocess", "worker group driver: `subprocess`, `noop` or `ecs` (the deployment)",
              choices=DRIVERS)
ECS_CLUSTER = _rpc("ECS_CLUSTER", "", "ECS driver: the cluster of the worker tasks")
ECS_TASK_DEFINITION = _rpc(
    "ECS_TASK_DEFINITION", "switchyard-worker-{pool}",
    "ECS driver: the pool's task definition family (the deployment sets `{stack}-worker-{pool}`)")
ECS_CAPACITY_PROVIDER = _rpc("ECS_CAPACITY_PROVIDER", "FARGATE",
                             "ECS driver: `FARGATE` or `FARGATE_SPOT` (the pool's `capacityProvider`)")
ECS_SUBNETS = _rpc("ECS_SUBNETS", (), "ECS driver: the worker tasks' subnets (comma-separated ids)",
                   shown="none")
ECS_SECURITY_GROUPS = _rpc("ECS_SECURITY_GROUPS", (),
                           "ECS driver: the worker tasks' security groups (comma-separated ids)")
ECS_MAX_TASKS = _rpc("ECS_MAX_TASKS", 0,
                     "ECS driver: the pool's tasks at most before it starts a warm spare (spares count; "
                     "`0`: no cap)")
ECS_CONTAINER = _rpc("ECS_CONTAINER", "worker",
                     "ECS driver: the container that gets the worker protocol's variables")
WORKER_HANDLER = _rpc("WORKER_HANDLER", "",
                      "`module:function` the subprocess driver's workers run (required by it unless "
                      "`SWITCHYARD_RPC_WORKER_COMMAND` is set; `switchyard local`: "
                      "`switchyard.rpc.examples:describe`)", shown="none")
WORKER_COMMAND = _rpc("WORKER_COMMAND", "", "the whole worker command (shell-split)",
                      shown="`python -m switchyard.rpc.worker --handler $SWITCHYARD_RPC_WORKER_HANDLER`")
MIN_WORKERS = _rpc("MIN_WORKERS", 1, "workers per group at least (subprocess driver)")
MIN_SPARES = _rpc(
    "MIN_SPARES", 0,
    "warm spare workers the pool keeps waiting, bound to no key: a new key's group adopts one instead of "
    "starting a worker or a task (subprocess and ECS drivers; `0`: none). "
    "See [spares](benchmarks.md#warm-spares)")
MAX_WORKERS = _rpc("MAX_WORKERS", 4, "workers per group at most (subprocess driver)")
TARGET_BACKLOG = _rpc(
    "TARGET_BACKLOG", 10,
    "waiting requests per worker before scaling out (KEDA's queue-length rule: like KEDA, the Kubernetes "
    "event-driven autoscaler, a group runs ceil(backlog / target) workers, within the minimum and maximum)")
WORKER_LOG_DIR = _rpc("WORKER_LOG_DIR", DEFAULT_WORKER_LOG_DIR, "one log file per worker group")
WORKER_STOP_TIMEOUT = _rpc("WORKER_STOP_TIMEOUT", 15.0, "seconds from SIGTERM to SIGKILL when a group stops",
                           unit="s")
# Kept for the code that names them.
CALL_TIMEOUT_ENV = CALL_TIMEOUT.name
HEARTBEAT_ENV = AMQP_HEARTBEAT.name
DEFAULT_HEARTBEAT_S = AMQP_HEARTBEAT.default


def heartbeat_from_env() -> int:
    """Seconds between AMQP heartbeats; the broker drops a connection silent for two of them."""
    heartbeat: int = AMQP_HEARTBEAT.read()
    if heartbeat < 0:
        raise ConfigError(f"{HEARTBEAT_ENV} must be >= 0 (0 disables heartbeats), got {heartbeat}")
    return heartbeat


@dataclass(frozen=True)
class PoolPolicy:
    """How a pool's request queues behave; applied through management-API policies."""

    queue_type: QueueType = QueueType.QUORUM
    message_ttl_ms: int = 300_000
    delivery_limit: int = 5
    # Amazon MQ installs its own default policies; ours must sit above them.
    priority: int = 10
    # Members of each new quorum queue (the broker takes as many nodes as it has, up to this): one per
    # node of Amazon MQ's three-node cluster. Said here, not left to the broker's own configuration.
    initial_group_size: int = 3

    def __post_init__(self) -> None:
        if self.message_ttl_ms <= 0:
            raise ConfigError("request message TTL must be a positive number of milliseconds")
        if self.delivery_limit < 1:
            raise ConfigError("delivery limit must be at least 1")
        if self.initial_group_size < 1:
            raise ConfigError(f"{QUORUM_INITIAL_GROUP_SIZE.name} must be at least 1")

    @classmethod
    def from_env(cls, source: Mapping[str, str] | None = None) -> PoolPolicy:
        source = config_source() if source is None else source
        return build(cls, POOL_POLICY, source, queue_type=QueueType(QUEUE_TYPE.read(source)))


@dataclass(frozen=True)
class RpcSettings:
    connections: Connections = field(default_factory=Connections)
    policy: PoolPolicy = field(default_factory=PoolPolicy)
    client_concurrency: int = 64
    call_timeout: float = 30.0
    worker_prefetch: int = 4
    worker_ack_delay_ms: float = 5.0
    activity_interval: float = 1.0

    @classmethod
    def from_env(cls, source: Mapping[str, str] | None = None) -> RpcSettings:
        source = config_source() if source is None else source
        return build(cls, RPC, source, connections=Connections.from_env(source),
                     policy=PoolPolicy.from_env(source))


@dataclass(frozen=True)
class Delays:
    unbind_s: float = 300.0
    stop_s: float = 600.0
    # How long a stopped group's tombstone is kept: activity reports later than this (from
    # workers nobody stopped, e.g. started by hand) count as a new group again.
    tombstone_s: float = 3600.0


@dataclass(frozen=True)
class ControlSettings:
    pool: str
    delays: Delays
    reconcile_interval_s: float = 1.0
    # How often (across every pool on the broker) the reconciler probes at-least-once dead-lettering;
    # under the alarm's five-minute period, so each period sees a probe. 0: never.
    dead_letter_probe_interval_s: float = 240.0
    # Where the probe runs on AWS: its own vhost, as its own user (the secret's ARN), so no per-pool
    # user needs the policymaker tag (switchyard/rpc/control/access.py). Empty: this plane's own.
    dead_letter_probe_vhost: str = ""
    dead_letter_probe_secret_arn: str = ""

    def probe_settings(self, settings: RpcSettings) -> RpcSettings | None:
        """``settings`` for the dead-lettering probe, or None if it runs with the plane's own."""
        if not (self.dead_letter_probe_vhost and self.dead_letter_probe_secret_arn):
            return None
        connections = settings.connections.as_amqp_user(self.dead_letter_probe_vhost,
                                                        self.dead_letter_probe_secret_arn)
        return replace(settings, connections=connections)

    @classmethod
    def from_env(cls, pool: str | None = None, source: Mapping[str, str] | None = None) -> ControlSettings:
        source = config_source() if source is None else source
        pool = pool or POOL.read(source)
        if not pool:
            raise ConfigError(f"{POOL.name} must name the pool this control plane manages")
        return build(cls, CONTROL, source, pool=protocol.validate_pool(pool),
                     delays=build(Delays, DELAYS, source))


@dataclass(frozen=True)
class DriverSettings:
    """The driver's settings, read once from the environment (see the module docstring)."""

    driver: str = "subprocess"
    command: tuple[str, ...] = ()
    min_workers: int = 1
    max_workers: int = 4
    target_backlog: int = 10
    min_spares: int = 0
    log_dir: str = DEFAULT_WORKER_LOG_DIR
    stop_timeout: float = 15.0

    @classmethod
    def from_env(cls, source: Mapping[str, str] | None = None, default_handler: str = "") -> DriverSettings:
        """``default_handler``: the workers' handler when none is set (local runs: ``DEMO_HANDLER``);
        without one the subprocess driver refuses to start."""
        source = config_source() if source is None else source
        raw_command = WORKER_COMMAND.read(source)
        handler = WORKER_HANDLER.read(source) or default_handler
        try:
            command = tuple(shlex.split(raw_command)) if raw_command else (
                (sys.executable, "-m", "switchyard.rpc.worker", "--handler", handler) if handler else ())
        except ValueError as exc:
            raise ConfigError(f"{WORKER_COMMAND.name} cannot be split: {exc}") from exc
        settings = build(cls, DRIVER_SETTINGS, source, command=command)
        if settings.driver == "subprocess" and not command:
            raise ConfigError(f"{WORKER_HANDLER.name} is not set: name the handler the workers run "
                              f"(module:function), or the whole command in {WORKER_COMMAND.name}")
        return settings


POOL_POLICY = {"message_ttl_ms": REQUEST_TTL, "delivery_limit": DELIVERY_LIMIT, "priority": POLICY_PRIORITY,
               "initial_group_size": QUORUM_INITIAL_GROUP_SIZE}
RPC = {"client_concurrency": CLIENT_CONCURRENCY, "call_timeout": CALL_TIMEOUT,
       "worker_prefetch": WORKER_PREFETCH, "worker_ack_delay_ms": WORKER_ACK_DELAY,
       "activity_interval": ACTIVITY_INTERVAL}
DELAYS = {"unbind_s": UNBIND_DELAY, "stop_s": STOP_DELAY, "tombstone_s": TOMBSTONE_TTL}
CONTROL = {"reconcile_interval_s": RECONCILE_INTERVAL,
           "dead_letter_probe_interval_s": DEAD_LETTER_PROBE_INTERVAL,
           "dead_letter_probe_vhost": DEAD_LETTER_PROBE_VHOST,
           "dead_letter_probe_secret_arn": DEAD_LETTER_PROBE_SECRET_ARN}
DRIVER_SETTINGS = {"driver": DRIVER, "min_workers": MIN_WORKERS, "max_workers": MAX_WORKERS,
                   "min_spares": MIN_SPARES,
                   "target_backlog": TARGET_BACKLOG, "log_dir": WORKER_LOG_DIR,
                   "stop_timeout": WORKER_STOP_TIMEOUT}
