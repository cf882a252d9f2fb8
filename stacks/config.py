"""The deployment's configuration: CDK context (cdk.json or ``-c key=json``), validated at synth time.

Every name derived from the configuration (pools, topics, the schema) is checked with the same
validators the runtime uses, so a bad value fails ``cdk synth`` with a message that names the
context key, instead of failing a deployment half-way or a Lambda at run time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from constructs import Construct

from stacks import constants, sizes
from stacks.base_image import BUILD_ARG, REPO_ROOT, local_tag
from stacks.context import ConfigError, parse_parts
from stacks.context import build as _build
from stacks.context import check as _check
from stacks.context import count as _count
from stacks.context import flag as _flag
from stacks.context import from_json as _json
from switchyard.delay.settings import DelaySettings, validate_schema, validate_topic
from switchyard.rpc.drivers.ecs import CAPACITY_PROVIDERS, DEFAULT_CAPACITY_PROVIDER
from switchyard.rpc.protocol import MAX_POOL_NAME_CHARS, validate_pool
from switchyard.rpc.settings import PoolPolicy

# EMR Serverless takes a custom image from ECR only (in the application's account and Region).
_ECR_IMAGE = re.compile(r"\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/[a-z0-9._/-]+"
                        r"(:[\w.-]+|@sha256:[0-9a-f]{64})")

# A pool's own Dockerfile starts from Switchyard's image, whichever the deploy passes as the build arg.
_FROM_BASE = re.compile(rf"^\s*ARG\s+{BUILD_ARG}\b.*^\s*FROM\s+\$\{{?{BUILD_ARG}\}}?\b", re.M | re.S | re.I)


# Fargate's valid cpu -> memory (MiB) combinations for the sizes a worker plausibly needs.
FARGATE_MEMORY = {
    256: (512, 1024, 2048),
    512: tuple(range(1024, 4097, 1024)),
    1024: tuple(range(2048, 8193, 1024)),
    2048: tuple(range(4096, 16385, 1024)),
    4096: tuple(range(8192, 30721, 1024)),
}


@dataclass(frozen=True)
class ImageDirectory:
    """A pool's own image, built by ``cdk deploy`` from a directory of this project whose Dockerfile
    starts from Switchyard's worker image (``ARG SWITCHYARD_IMAGE``, ``FROM ${SWITCHYARD_IMAGE}``):
    the handler's module on top of the runtime (examples/pricing is one)."""

    directory: str  # relative to the project root, as written in the context

    @property
    def path(self) -> Path:
        return REPO_ROOT / self.directory

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> ImageDirectory:
        """Checked at synth, so a wrong path fails ``cdk synth`` and not a Docker build mid-deploy."""
        form = 'image must be "" (built from Dockerfile), an image URI or {"directory": "examples/pricing"}'
        _check(set(raw) == {"directory"} and isinstance(raw["directory"], str) and raw["directory"] != "",
               where, f"{form}, got {raw!r}")
        directory = raw["directory"]
        path = (REPO_ROOT / directory).resolve()
        _check(not Path(directory).is_absolute() and path.is_relative_to(REPO_ROOT), where,
               f"image directory {directory!r} is outside the project: give a path relative to {REPO_ROOT} "
               "(the deploy builds only what the checkout holds)")
        _check(path.is_dir(), where, f"image directory {directory!r} does not exist under {REPO_ROOT}")
        dockerfile = path / "Dockerfile"
        _check(dockerfile.is_file(), where, f"image directory {directory!r} has no Dockerfile")
        shown = (Path(directory) / "Dockerfile").as_posix()
        _check(_FROM_BASE.search(dockerfile.read_text()) is not None, where,
               f"{shown} must start from Switchyard's worker image: 'ARG {BUILD_ARG}', then "
               f"'FROM ${{{BUILD_ARG}}}' (see examples/pricing/Dockerfile)")
        return cls(path.relative_to(REPO_ROOT).as_posix())


@dataclass(frozen=True)
class PoolConfig:
    """One pool: its workers (ECS) and its control plane (the four Lambda functions)."""

    name: str
    handler: str = "switchyard.rpc.examples:describe"
    # "": built from the repository's Dockerfile; an image URI; {"directory": ...}: ImageDirectory
    image: str | ImageDirectory = ""
    cpu: int = 256
    memory_mib: int = 512
    min_workers: int = 1
    max_workers: int = 4
    target_backlog: int = 10
    min_spares: int = 0  # warm spare workers bound to no key (switchyard.rpc.spares)
    unbind_delay_seconds: int = 300
    stop_delay_seconds: int = 600
    batch_size: int = 100  # Amazon MQ event source: messages per invocation (1-10,000)
    batch_window_seconds: int = 1  # and how long to gather them (0-300)
    queue_depth_alarm_minutes: int = 5
    capacity_provider: str = DEFAULT_CAPACITY_PROVIDER  # FARGATE_SPOT: ~70% cheaper, may be interrupted

    def __post_init__(self) -> None:
        where = f"{constants.CTX_POOLS}[{self.name!r}]"
        _check(len(self.name) <= MAX_POOL_NAME_CHARS, where,
               f"pool names are at most {MAX_POOL_NAME_CHARS} characters (switchyard.rpc.protocol)")
        validate_pool(self.name)
        if isinstance(self.image, dict):  # from the context's JSON: made typed once, here
            object.__setattr__(self, "image", ImageDirectory.parse(self.image, where))
        _check(isinstance(self.image, str | ImageDirectory), where,
               f'image must be "", an image URI or {{"directory": ...}}, got {self.image!r}')
        _check(":" in self.handler and all(self.handler.split(":")), where,
               f"handler must be module:function, got {self.handler!r}")
        _check(self.cpu in FARGATE_MEMORY, where, f"cpu must be one of {sorted(FARGATE_MEMORY)}")
        _check(
            self.memory_mib in FARGATE_MEMORY.get(self.cpu, ()),
            where,
            f"memoryMib {self.memory_mib} is not a Fargate size for cpu {self.cpu}: "
            f"use one of {FARGATE_MEMORY.get(self.cpu)}",
        )
        _check(1 <= self.min_workers <= self.max_workers, where, "need 1 <= minWorkers <= maxWorkers")
        _check(self.target_backlog >= 1, where, "targetBacklog must be at least 1")
        _check(self.min_spares >= 0, where, "minSpares must be 0 or more")
        _check(
            0 < self.unbind_delay_seconds < self.stop_delay_seconds,
            where,
            "need 0 < unbindDelaySeconds < stopDelaySeconds",
        )
        _check(1 <= self.batch_size <= 10_000, where, "batchSize must be 1-10,000 (Amazon MQ event source)")
        _check(0 <= self.batch_window_seconds <= 300, where, "batchWindowSeconds must be 0-300")
        _check(self.queue_depth_alarm_minutes >= 1, where, "queueDepthAlarmMinutes must be at least 1")
        _check(self.capacity_provider in CAPACITY_PROVIDERS, where,
               f"capacityProvider must be one of {list(CAPACITY_PROVIDERS)}, got {self.capacity_provider!r}")

    @property
    def first_call_s(self) -> int:
        """How long a new key's first request may wait for its worker (the estimate in constants.py)."""
        orphan_handled = self.batch_window_seconds + constants.ORPHAN_HANDLER_START_S
        return orphan_handled + constants.FARGATE_TASK_START_S + constants.WORKER_START_S

    @property
    def queue_depth_threshold(self) -> int:
        """The backlog ``max_workers`` are sized for: above it for N minutes, the group cannot keep up."""
        return self.max_workers * self.target_backlog


@dataclass(frozen=True)
class DelayConfig:
    """The delay scheduler as deployed: its topics and schema (the runtime's defaults, from
    ``DelaySettings``), the input topic's partitions, the MSK event source and the alarms' bounds."""

    input_topic: str = DelaySettings.input_topic
    output_topic: str = DelaySettings.output_topic
    partitions: int = 3
    schema: str = DelaySettings.schema
    batch_size: int = 1000  # MSK event source: records per invocation (1-10,000)
    batch_window_seconds: int = 1
    starting_position: str = "TRIM_HORIZON"
    lateness_sla_ms: int = 500
    offset_lag_alarm: int = 10_000  # records behind on the input topic

    def __post_init__(self) -> None:
        where = constants.CTX_DELAY
        validate_topic(self.input_topic)
        validate_topic(self.output_topic)
        validate_schema(self.schema)
        _check(self.input_topic != self.output_topic, where, "inputTopic and outputTopic must differ")
        _check(1 <= self.partitions <= 1000, where, "partitions must be 1-1000")
        _check(1 <= self.batch_size <= 10_000, where, "batchSize must be 1-10,000 (MSK event source)")
        _check(0 <= self.batch_window_seconds <= 300, where, "batchWindowSeconds must be 0-300")
        _check(
            self.starting_position in ("LATEST", "TRIM_HORIZON"),
            where,
            "startingPosition must be LATEST or TRIM_HORIZON",
        )
        _check(
            self.lateness_sla_ms >= 1 and self.offset_lag_alarm >= 1,
            where,
            "latenessSlaMs and offsetLagAlarm must be positive",
        )


@dataclass(frozen=True)
class MskConfig:
    instance_type: str = "kafka.t3.small"
    kafka_version: str = "3.8.x"
    broker_nodes: int = 2
    volume_gib: int = 20

    def __post_init__(self) -> None:
        _check(self.broker_nodes % constants.VPC_MAX_AZS == 0, constants.CTX_MSK,
               f"brokerNodes must be a multiple of the {constants.VPC_MAX_AZS} availability zones")
        _check(self.instance_type.startswith("kafka."), constants.CTX_MSK,
               "instanceType must be a kafka.* type")
        _check(self.volume_gib >= 1, constants.CTX_MSK, "volumeGib must be at least 1")

    @property
    def replication_factor(self) -> int:
        return min(3, self.broker_nodes)


@dataclass(frozen=True)
class PostgresConfig:
    instance_type: str = "t4g.small"
    engine_version: str = "16"
    allocated_storage_gib: int = 20
    # max_connections of the instance class (RDS: DBInstanceClassMemory / 9531392; 2 GiB ~ 200).
    max_connections: int = 200
    multi_az: bool = False
    deletion_protection: bool = False

    def __post_init__(self) -> None:
        _check(self.engine_version in constants.POSTGRES_VERSIONS, constants.CTX_POSTGRES,
               f"engineVersion must be one of {sorted(constants.POSTGRES_VERSIONS)}")
        _check(self.allocated_storage_gib >= 20, constants.CTX_POSTGRES,
               "allocatedStorageGib must be at least 20")
        _check(self.max_connections >= 20, constants.CTX_POSTGRES, "maxConnections must be at least 20")


@dataclass(frozen=True)
class RedisConfig:
    """The ElastiCache group: one primary with ``replicas`` (cluster mode off), or, with
    ``cluster_mode``, ``shards`` node groups of a primary and ``replicas`` each (a Redis Cluster:
    the processes get SWITCHYARD_REDIS_CLUSTER=1 and the configuration endpoint)."""

    node_type: str = "cache.t4g.micro"
    engine: str = "valkey"
    engine_version: str = "8.0"
    replicas: int = 0  # per shard
    memory_alarm_percent: int = 80
    cluster_mode: bool = False
    shards: int = 1

    def __post_init__(self) -> None:
        _check(self.engine in ("redis", "valkey"), constants.CTX_REDIS, "engine must be redis or valkey")
        # The pending queue's blocking pop (BLMOVE) and guard swap (SET ... GET) need Redis 6.2
        # (every Valkey has them)
        version = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", self.engine_version)
        recent = version is not None and (
            self.engine == "valkey" or tuple(map(int, version.groups())) >= (6, 2))
        _check(recent, constants.CTX_REDIS,
               f"engineVersion {self.engine_version!r}: Redis 6.2 or later is needed (BLMOVE)")
        _check(self.node_type.startswith("cache."), constants.CTX_REDIS, "nodeType must be a cache.* type")
        _check(0 <= self.replicas <= 5, constants.CTX_REDIS, "replicas must be 0-5")
        _check(1 <= self.memory_alarm_percent <= 100, constants.CTX_REDIS, "memoryAlarmPercent must be 1-100")
        self._check_cluster_mode()

    def _check_cluster_mode(self) -> None:
        """Shards only with cluster mode, within ElastiCache's limits, each with a replica: ElastiCache
        requires automatic failover in cluster mode, and a shard without a replica takes its slots
        (its keys' pending requests, bus events, locks) down with its node until the node is replaced,
        so N shards without replicas would fail N times as often as the one node they replace."""
        _check(1 <= self.shards <= constants.REDIS_MAX_SHARDS, constants.CTX_REDIS,
               f"shards must be 1-{constants.REDIS_MAX_SHARDS}")
        _check(self.cluster_mode or self.shards == 1, constants.CTX_REDIS,
               f"shards {self.shards} needs clusterMode true (cluster mode off is one shard)")
        if not self.cluster_mode:
            return
        _check(self.replicas >= 1, constants.CTX_REDIS,
               "clusterMode needs replicas >= 1 per shard: a shard's replica is what takes over when its "
               "primary fails (automatic failover, Multi-AZ); without one the shard's keys are unavailable "
               "until ElastiCache replaces the node")
        _check(self.nodes <= constants.REDIS_MAX_NODES, constants.CTX_REDIS,
               f"shards x (1 + replicas) = {self.nodes} nodes, more than ElastiCache's "
               f"{constants.REDIS_MAX_NODES}")

    @property
    def nodes(self) -> int:
        """The cache nodes the group runs, and bills."""
        return self.shards * (1 + self.replicas)

    @property
    def cluster_parameter_group(self) -> str:
        """ElastiCache's default parameter group with ``cluster-enabled yes`` for the engine's major version
        (``default.valkey8.cluster.on``, ``default.redis7.cluster.on``, ``default.redis6.x.cluster.on``)."""
        major = int(self.engine_version.split(".")[0])
        family = f"{self.engine}{major}" + (".x" if self.engine == "redis" and major == 6 else "")
        return f"default.{family}.cluster.on"


@dataclass(frozen=True)
class BusConfig:
    """The event bus's delivery workers: an ECS service of ``workers`` always-on tasks."""

    workers: int = constants.BUS_WORKERS
    capacity_provider: str = DEFAULT_CAPACITY_PROVIDER  # FARGATE_SPOT: cheaper, a task may be stopped

    def __post_init__(self) -> None:
        _check(self.workers >= 1, constants.CTX_BUS, "workers must be at least 1 (events wait for one)")
        _check(self.capacity_provider in CAPACITY_PROVIDERS, constants.CTX_BUS,
               f"capacityProvider must be one of {list(CAPACITY_PROVIDERS)}, got {self.capacity_provider!r}")


@dataclass(frozen=True)
class ConcurrencyConfig:
    """Reserved concurrency of the functions that loop (fire, sweep), and the account's Lambda limit.

    The reconcilers (one per pool) and bus housekeeping reserve 1 each by design: one pass at a time.
    """

    account_limit: int = constants.DEFAULT_ACCOUNT_CONCURRENCY
    fire: int = constants.FIRE_RESERVED_CONCURRENCY  # 2: the next invocation starts before the last one ends
    sweep: int = constants.SWEEP_RESERVED_CONCURRENCY
    pending_api: int = constants.PENDING_API_RESERVED_CONCURRENCY  # caps the node API's long polls
    bus_api: int = constants.BUS_API_RESERVED_CONCURRENCY  # caps what a flood of requests runs (and costs)

    def __post_init__(self) -> None:
        _check(min(self.fire, self.sweep, self.pending_api, self.bus_api) >= 1, constants.CTX_CONCURRENCY,
               "fire, sweep, pendingApi and busApi must be at least 1 (0 would throttle every invocation)")
        _check(self.account_limit >= 1, constants.CTX_CONCURRENCY, "accountLimit must be positive")

    def check_reserved(self, reserved: dict[str, int], account: int = 0) -> None:
        """Fail synth unless ``reserved`` (function -> executions) leaves Lambda's minimum unreserved
        of the account's limit: ``account`` (read from the account by ./dev deploy), else accountLimit."""
        total = sum(reserved.values())
        limit = account or self.account_limit
        budget = limit - constants.LAMBDA_MIN_UNRESERVED
        source = (f"the account's limit, {limit} (lambda get-account-settings, read by ./dev deploy),"
                  if account else f"accountLimit {limit}")
        _check(
            total <= budget,
            constants.CTX_CONCURRENCY,
            f"the stack would reserve {total} concurrent executions "
            f"({', '.join(f'{name} {n}' for name, n in sorted(reserved.items()))}), but Lambda keeps at "
            f"least {constants.LAMBDA_MIN_UNRESERVED} unreserved of the account's limit, so with {source} "
            f"at most {max(0, budget)} can be reserved and the deploy would fail. Raise "
            "the account's 'Concurrent executions' quota (Service Quotas, AWS Lambda) and set accountLimit "
            f"in {constants.CTX_CONCURRENCY} to it, or reserve less (fire, sweep, pendingApi, busApi; "
            "fewer pools).",
        )


@dataclass(frozen=True)
class DeploymentConfig:
    pools: tuple[PoolConfig, ...]
    delay: DelayConfig = field(default_factory=DelayConfig)
    msk: MskConfig = field(default_factory=MskConfig)
    postgres: PostgresConfig = field(default_factory=PostgresConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    alarm_email: str = ""
    emr_image: str = ""  # the EMR Serverless application's custom image (python3.11), if any
    base_image: str = ""  # what pools' own images start FROM; empty: ./dev deploy's local build
    concurrency: ConcurrencyConfig = field(default_factory=ConcurrencyConfig)
    # the callers' default (SWITCHYARD_RPC_CALL_TIMEOUT_S)
    call_timeout_seconds: int = constants.DEFAULT_AWS_CALL_TIMEOUT_S
    # Production keeps the data: RDS deletion protection, snapshots of RDS and ElastiCache on delete.
    production: bool = False
    nat_gateways: int = constants.VPC_NAT_GATEWAYS  # one per AZ (VPC_MAX_AZS) survives the loss of an AZ
    account_concurrency: int = 0  # the account's Lambda limit as ./dev deploy read it (0: not read)
    parts: frozenset[str] = frozenset(constants.PARTS)  # what the stack deploys (switchyard:parts)
    size: str = ""  # switchyard:size: dev, production, or "" (each key's own default)
    bus: BusConfig = field(default_factory=BusConfig)

    def has(self, *parts: str) -> bool:
        """Whether every one of ``parts`` is deployed."""
        return all(part in self.parts for part in parts)

    @property
    def redis_needed(self) -> bool:
        """ElastiCache holds the rpc pools' state, the pending queue and the bus."""
        return bool(self.parts & {constants.PART_RPC, constants.PART_PENDING, constants.PART_BUS})

    @property
    def ecs_needed(self) -> bool:
        """The ECS cluster runs the rpc pools' workers and the bus's delivery workers."""
        return bool(self.parts & {constants.PART_RPC, constants.PART_BUS})

    def __post_init__(self) -> None:
        _check(1 <= self.nat_gateways <= constants.VPC_MAX_AZS, constants.CTX_NAT_GATEWAYS,
               f"natGateways must be 1-{constants.VPC_MAX_AZS} (one per availability zone at most)")
        names = [p.name for p in self.pools]
        _check(bool(names) or not self.has(constants.PART_RPC), constants.CTX_POOLS,
               "configure at least one pool")
        dupes = sorted({n for n in names if names.count(n) > 1})
        _check(not dupes, constants.CTX_POOLS, f"pool names must be unique, repeated: {dupes}")
        _check(self.msk.replication_factor <= self.msk.broker_nodes, constants.CTX_MSK, "too few brokers")
        _check(self.alarm_email == "" or "@" in self.alarm_email, constants.CTX_ALARM_EMAIL,
               f"not an e-mail address: {self.alarm_email!r}")
        _check(
            self.emr_image == "" or _ECR_IMAGE.fullmatch(self.emr_image) is not None,
            constants.CTX_EMR_IMAGE,
            f"not an ECR image URI (ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME:TAG or @sha256:...): "
            f"{self.emr_image!r}",
        )
        self._check_call_timeout()
        budget = self.postgres_connection_budget
        limit = self.postgres.max_connections * constants.POSTGRES_BUDGET_SHARE // 100
        _check(
            budget <= limit or not self.has(constants.PART_DELAY),
            constants.CTX_POSTGRES,
            f"the delay functions may open {budget} connections (enqueue and the scheduled-call relay: "
            f"one per partition each, "
            f"fire and sweep: reserved concurrency x connections each, migration: 1), more than "
            f"{constants.POSTGRES_BUDGET_SHARE}% of maxConnections {self.postgres.max_connections}: "
            "use fewer partitions or a larger instance",
        )

    def _check_call_timeout(self) -> None:
        """A new key's first call must be answered: its timeout outlives the wait for a Fargate task."""
        timeout = self.call_timeout_seconds
        for pool in self.pools:
            _check(
                timeout >= pool.first_call_s,
                constants.CTX_CALL_TIMEOUT,
                f"a call timeout of {timeout} s expires a new key's first call in pool {pool.name!r} before "
                f"its worker can answer: about {pool.first_call_s} s (the orphan handler "
                f"{constants.ORPHAN_HANDLER_START_S} s after batchWindowSeconds "
                f"{pool.batch_window_seconds}, a Fargate task's start {constants.FARGATE_TASK_START_S} s, "
                f"the worker's {constants.WORKER_START_S} s). "
                "Raise callTimeoutSeconds or lower the pool's batchWindowSeconds.",
            )
        ttl_s = PoolPolicy().message_ttl_ms // 1000
        _check(timeout <= ttl_s, constants.CTX_CALL_TIMEOUT,
               f"callTimeoutSeconds {timeout} is longer than the request queues' TTL ({ttl_s} s): the queue "
               "would expire a request its caller still waits for")

    @property
    def base_image_ref(self) -> str:
        """The ``SWITCHYARD_IMAGE`` build arg of every pool's own image (stacks/base_image.py)."""
        return self.base_image or local_tag()

    @property
    def postgres_connection_budget(self) -> int:
        """Connections the delay functions can hold at once (each warm environment keeps its own)."""
        return (
            self.delay.partitions * constants.CONNECTIONS_PER_ENQUEUE
            + self.concurrency.fire * constants.CONNECTIONS_PER_FIRE
            + self.concurrency.sweep * constants.CONNECTIONS_PER_SWEEP
            + self.delay.partitions * constants.CONNECTIONS_PER_RELAY
            + 1
        )

    @classmethod
    def from_context(cls, scope: Construct) -> DeploymentConfig:
        def ctx(key: str) -> Any:  # the key's value over its size's (stacks/sizes.py)
            return sizes.context(scope, key, parse=lambda raw: _json(raw, key))

        try:
            size = sizes.size_of(scope)
        except sizes.SizeError as exc:
            raise ConfigError(str(exc)) from exc
        parts = parse_parts(scope.node.try_get_context(constants.CTX_PARTS))

        raw_pools = ctx(constants.CTX_POOLS)
        if isinstance(raw_pools, str):
            try:
                raw_pools = json.loads(raw_pools)
            except ValueError as exc:
                raise ConfigError(f"{constants.CTX_POOLS}: not valid JSON ({exc})") from exc
        if raw_pools is None:
            raw_pools = [{"name": constants.EXAMPLE_POOL}]
        if not isinstance(raw_pools, list) or not all(isinstance(p, dict) and "name" in p for p in raw_pools):
            raise ConfigError(f'{constants.CTX_POOLS} must be a list of objects with a "name", '
                              f'got {raw_pools!r}')
        provider = sizes.preset(scope, "pool.capacityProvider")
        pools = tuple(_build(PoolConfig, {**({"capacityProvider": provider} if provider else {}), **p},
                             f"{constants.CTX_POOLS}[{p['name']!r}]") for p in raw_pools)
        return cls(
            pools=pools if constants.PART_RPC in parts else (),
            parts=parts,
            size=size,
            bus=_build(BusConfig, ctx(constants.CTX_BUS), constants.CTX_BUS),
            delay=_build(DelayConfig, ctx(constants.CTX_DELAY), constants.CTX_DELAY),
            msk=_build(MskConfig, ctx(constants.CTX_MSK), constants.CTX_MSK),
            postgres=_build(PostgresConfig, ctx(constants.CTX_POSTGRES), constants.CTX_POSTGRES),
            redis=_build(RedisConfig, ctx(constants.CTX_REDIS), constants.CTX_REDIS),
            alarm_email=str(ctx(constants.CTX_ALARM_EMAIL) or ""),
            emr_image=str(ctx(constants.CTX_EMR_IMAGE) or ""),
            base_image=str(ctx(constants.CTX_BASE_IMAGE) or ""),
            concurrency=_build(ConcurrencyConfig, ctx(constants.CTX_CONCURRENCY), constants.CTX_CONCURRENCY),
            call_timeout_seconds=_count(ctx(constants.CTX_CALL_TIMEOUT), constants.CTX_CALL_TIMEOUT,
                                        constants.DEFAULT_AWS_CALL_TIMEOUT_S),
            production=_flag(ctx(constants.CTX_PRODUCTION), constants.CTX_PRODUCTION),
            nat_gateways=_count(ctx(constants.CTX_NAT_GATEWAYS), constants.CTX_NAT_GATEWAYS,
                                constants.VPC_NAT_GATEWAYS),
            account_concurrency=_count(ctx(constants.CTX_ACCOUNT_CONCURRENCY),
                                       constants.CTX_ACCOUNT_CONCURRENCY, 0),
        )
