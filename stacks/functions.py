"""Lambda: the layer, every handler of ``functions/``, their event sources, schedules and the
deploy-time custom resources (pools declared, delay schema migrated, delay topics created).

Every function: the Python and CPU of ``stacks/platform.py``, the one layer, Powertools' environment
(service, metrics namespace, log level), X-Ray active tracing, the private subnets with the functions'
security group, and a role holding only what its handler touches. Connection URLs carry placeholders that
the runtime fills from Secrets Manager (``switchyard/core/aws_secrets.py``): no secret value is in the
template or in a function's configuration.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from aws_cdk import CustomResource, Duration, Fn, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from aws_cdk import custom_resources as cr
from constructs import Construct

from stacks import constants
from stacks.broker import BrokerConstruct
from stacks.config import ConfigError, DeploymentConfig, PoolConfig
from stacks.data import DataConstruct, chosen
from stacks.grants import (
    ecs_pool_access,
    ecs_stop_access,
    event_source_network_access,
    kafka_access,
    read_secrets,
    read_secrets_named,
)
from stacks.names import broker_users_secret_prefix, metrics_namespace, physical_name
from stacks.network import NetworkConstruct
from stacks.parameters import (
    DELAY_CONSUMER_GROUP,
    SCHEDULED_CONSUMER_GROUP,
    ConfigParametersConstruct,
    ServiceEndpoints,
    environment,
    secret_arn_env,
)
from stacks.platform import lambda_architecture, lambda_runtime
from stacks.pool_stacks import POOL_QUEUES, POOL_ROLES, PoolFunctions, pool_scope
from stacks.workers import WorkersConstruct, worker_family
from switchyard.core.deployed_config import CONFIG_PATH_ENV
from switchyard.core.observability import DELAY_SERVICE, DEPLOY_SERVICE, SCHEDULED_SERVICE, pool_service
from switchyard.core.settings import LOG_LEVEL
from switchyard.delay.settings import DELAY
from switchyard.rpc import settings as rpc
from switchyard.rpc.control.access import BrokerRole
from switchyard.rpc.protocol import DEAD_LETTER_PROBE_VHOST

REPO_ROOT = Path(__file__).resolve().parent.parent


def code_version() -> str:
    """A digest of the core package and pins: custom resources re-run when the code they run changes."""
    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "switchyard").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(REPO_ROOT)).encode())
            digest.update(path.read_bytes())
    digest.update((REPO_ROOT / "requirements.txt").read_bytes())
    return digest.hexdigest()[:16]


class FunctionsConstruct(Construct):
    """``layer``, ``pools[name]`` (four functions each), ``delay`` (enqueue, fire, sweep), ``scheduled``
    (the scheduled-call relay), ``deploy``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        network: NetworkConstruct,
        broker: BrokerConstruct | None,
        data: DataConstruct,
        workers: WorkersConstruct | None,
        config: DeploymentConfig,
        endpoints: ServiceEndpoints,
        parameters: ConfigParametersConstruct,
        layer_dir: str,
    ) -> None:
        """``endpoints``: the connection settings of every function's environment; ``parameters``: the
        deployed configuration, which every function may read (its path in SWITCHYARD_CONFIG_PATH)."""
        super().__init__(scope, construct_id)
        self.endpoints, self.parameters = endpoints, parameters
        # The broker and the workers are the rpc part's (None without it: switchyard:parts).
        self.network, self.data, self.config = network, data, config
        self._broker, self._workers = broker, workers
        self.stack = Stack.of(self)
        self.layer = self._build_layer(layer_dir)
        self._code: dict[str, lambda_.Code] = {}  # one per stack: an asset belongs to one
        self.functions: dict[str, lambda_.Function] = {}
        self.providers: list[cr.Provider] = []
        rpc, delay = config.has(constants.PART_RPC), config.has(constants.PART_DELAY)
        self.deploy = {**(self._build_pools_resource() if rpc else {}),
                       **(self._build_delay_resources() if delay else {})}
        self.pools = {pool.name: self._build_pool(pool) for pool in config.pools}
        self._kafka_failures = self._build_kafka_failures() if delay else None
        self.delay = self._build_delay() if delay else {}
        # Scheduled calls go from the delay scheduler into the pools: with both parts only.
        self._scheduled = self._build_scheduled() if rpc and delay else None
        self.schedules = self._build_schedules()

    @property
    def broker(self) -> BrokerConstruct:
        return chosen(self._broker, constants.PART_RPC)

    @property
    def workers(self) -> WorkersConstruct:
        return chosen(self._workers, "rpc or bus")

    @property
    def kafka_failures(self) -> sqs.Queue:
        return chosen(self._kafka_failures, constants.PART_DELAY)

    @property
    def scheduled(self) -> lambda_.Function:
        return chosen(self._scheduled, "rpc and delay")

    # -- building blocks ------------------------------------------------------------------------
    def _build_layer(self, layer_dir: str) -> lambda_.LayerVersion:
        path = Path(layer_dir)
        path = path if path.is_absolute() else REPO_ROOT / path
        if not (path / "python").is_dir():
            raise ConfigError(f"the Lambda layer is not built at {path}: run ./dev deploy (it builds the "
                              "layer, then deploys), or layers/build.sh first, or point -c "
                              f"{constants.CTX_LAYER_DIR}=DIR at a built layer")
        return lambda_.LayerVersion(
            self,
            "Layer",
            code=lambda_.Code.from_asset(str(path)),
            compatible_runtimes=[lambda_runtime()],
            compatible_architectures=[lambda_architecture()],
            description="Switchyard: pinned requirements.txt and the switchyard package (layers/build.sh)",
            removal_policy=RemovalPolicy.RETAIN,
        )

    def code(self, scope: Construct) -> lambda_.Code:
        """The functions' code (functions/) for a function in ``scope``'s stack."""
        path = Stack.of(scope).node.path
        if path not in self._code:
            self._code[path] = lambda_.Code.from_asset(str(REPO_ROOT / constants.FUNCTIONS_DIR),
                                                       exclude=["__pycache__", "*.pyc"])
        return self._code[path]

    def add_function(
        self,
        construct_id: str,
        module: str,
        *,
        service: str,
        environment: Mapping[str, str],
        timeout_s: int,
        handler: str = "lambda_handler",
        reserved_concurrency: int | None = None,
        public: bool = False,
        scope: Construct | None = None,
    ) -> lambda_.Function:
        """A function of ``functions/{module}.py``: the one layer, VPC, Powertools, X-Ray and log group, and
        read access to the deployed configuration. Other constructs (the bus, the pending queue) make
        theirs here too, so every function is in ``functions`` and gets the same checks. ``public``: behind
        a public API, in the API functions' security group (stacks/network.py). ``scope``: where it is
        made, if not here (a pool's nested stack)."""
        scope = scope or self
        log_group = logs.LogGroup(
            scope,
            f"{construct_id}Logs",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )
        fn = lambda_.Function(
            scope,
            construct_id,
            runtime=lambda_runtime(),
            architecture=lambda_architecture(),
            code=self.code(scope),
            handler=f"{module}.{handler}",
            layers=[self.layer],
            memory_size=constants.LAMBDA_MEMORY_MB,
            timeout=Duration.seconds(timeout_s),
            tracing=lambda_.Tracing.ACTIVE,
            vpc=self.network.vpc,
            vpc_subnets=self.network.egress_subnets,
            security_groups=[self.network.api_sg if public else self.network.functions_sg],
            reserved_concurrent_executions=reserved_concurrency,
            log_group=log_group,
            environment={
                "POWERTOOLS_SERVICE_NAME": service,
                "POWERTOOLS_METRICS_NAMESPACE": metrics_namespace(self),
                "POWERTOOLS_LOG_LEVEL": constants.LOG_LEVEL,
                LOG_LEVEL.name: constants.LOG_LEVEL,
                CONFIG_PATH_ENV: self.parameters.path,
                **environment,
            },
        )
        self.parameters.grant_read(fn)
        self.functions[construct_id] = fn
        return fn

    def _amqp_env(self, secret: secretsmanager.ISecret) -> dict[str, str]:
        """The broker's URLs, filled from ``secret``: the admin's or a role's user (rpc/control/access.py)."""
        return {**self.endpoints.amqp_env(), **secret_arn_env("AMQP", secret)}

    def redis_env(self) -> dict[str, str]:
        """Redis's URL (its password from the data construct's secret): the functions on the stack's Redis."""
        return self.endpoints.redis_env()

    def _postgres_env(self) -> dict[str, str]:
        return self.endpoints.postgres_env()

    def _kafka_env(self) -> dict[str, str]:
        return self.endpoints.kafka_env(self.config.delay)

    # -- custom resources ------------------------------------------------------------------------
    def _custom_resource(
        self, name: str, module: str, properties: Mapping[str, object], environment: Mapping[str, str]
    ) -> tuple[lambda_.Function, CustomResource]:
        fn = self.add_function(
            f"Deploy{name}",
            module,
            handler="on_event",
            service=DEPLOY_SERVICE,
            environment=environment,
            timeout_s=constants.DEPLOY_TIMEOUT_S,
        )
        provider = cr.Provider(
            self,
            f"Deploy{name}Provider",
            on_event_handler=fn,
            log_group=logs.LogGroup(
                self,
                f"Deploy{name}ProviderLogs",
                retention=logs.RetentionDays.ONE_MONTH,
                removal_policy=RemovalPolicy.DESTROY,
            ),
        )
        resource = CustomResource(
            self,
            f"Deploy{name}Resource",
            service_token=provider.service_token,
            resource_type=f"Custom::Switchyard{name}",
            properties={**properties, "CodeVersion": code_version()},
        )
        # The function reads the deployed configuration by path at run time: nothing references the
        # parameters, so without this CloudFormation may run the resource before they exist.
        resource.node.add_dependency(self.parameters)
        self.providers.append(provider)
        return fn, resource

    def _build_pools_resource(self) -> dict[str, CustomResource]:
        # The admin's one process: it declares the pools and makes every role's user from its secret.
        users = [{"Role": user.role.value, "Pool": user.pool or "", "Application": user.application or "",
                  "SecretArn": secret.secret_arn} for user, secret in self.broker.users.items()]
        # Its Delete stops the pools' worker tasks (switchyard/aws/teardown.py): it depends on the
        # cluster, so CloudFormation deletes it, and stops them, before the cluster.
        teardown = {"Cluster": self.workers.cluster.cluster_name,
                    "Families": [worker_family(self, p.name) for p in self.config.pools]}
        pools_fn, pools = self._custom_resource(
            "Pools", "deploy_pools",
            {"Pools": [p.name for p in self.config.pools], "Users": users, **teardown},
            self._amqp_env(self.broker.secret)
        )
        read_secrets(pools_fn, self.broker.secret)  # and every role user's, however many pools:
        read_secrets_named(pools_fn, broker_users_secret_prefix(self))
        ecs_stop_access(pools_fn, self.workers.cluster)
        pools.node.add_dependency(self.workers.cluster)  # its capacity provider associations too
        return {"pools": pools}

    def _build_delay_resources(self) -> dict[str, CustomResource]:
        d = self.config.delay
        schema_fn, schema = self._custom_resource(
            "DelaySchema",
            "deploy_delay_schema",
            {"Schema": d.schema},
            {**self._postgres_env(), **environment({DELAY["schema"]: d.schema})},
        )
        read_secrets(schema_fn, self.data.postgres_secret)
        schema.node.add_dependency(self.data.postgres)
        topics_fn, topics = self._custom_resource(
            "Topics",
            "deploy_topics",
            {
                "Topics": [d.input_topic, d.output_topic],
                "Partitions": d.partitions,
                "ReplicationFactor": self.config.msk.replication_factor,
            },
            self._kafka_env(),
        )
        kafka_access(topics_fn, self.data.kafka.attr_arn, create=(d.input_topic, d.output_topic))
        return {"schema": schema, "topics": topics}

    # -- RPC control plane, per pool -------------------------------------------------------------
    def _pool_env(self, pool: PoolConfig, driver: str, broker_user: secretsmanager.ISecret) -> dict[str, str]:
        env = {
            **self._amqp_env(broker_user),
            **self.redis_env(),
            **environment({rpc.POOL: pool.name, rpc.UNBIND_DELAY: pool.unbind_delay_seconds,
                           rpc.STOP_DELAY: pool.stop_delay_seconds, rpc.DRIVER: driver}),
        }
        if driver == "ecs":
            subnets = self.network.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
            env.update(environment({
                rpc.ECS_CLUSTER: self.workers.cluster.cluster_name,
                rpc.ECS_TASK_DEFINITION: worker_family(self, pool.name),
                rpc.ECS_SUBNETS: Fn.join(",", subnets.subnet_ids),
                rpc.ECS_SECURITY_GROUPS: self.network.workers_sg.security_group_id,
                rpc.ECS_CAPACITY_PROVIDER: pool.capacity_provider,
                rpc.MIN_WORKERS: pool.min_workers, rpc.MIN_SPARES: pool.min_spares,
                rpc.MAX_WORKERS: pool.max_workers,
                rpc.TARGET_BACKLOG: pool.target_backlog,
            }))
        return env

    def _build_pool(self, pool: PoolConfig) -> PoolFunctions:
        service = pool_service(pool.name)
        scope = pool_scope(self, pool.name)
        made: dict[str, lambda_.Function] = {}
        for role in ("orphans", "dead_letters", "activity", "reconcile"):
            starts_groups = role in ("orphans", "reconcile")
            broker_user = self.broker.user_secret(POOL_ROLES[role], pool.name)
            fn = self.add_function(
                f"{pool.name}-{role}",
                f"rpc_{role}",
                service=service,
                environment=self._pool_env(pool, "ecs" if starts_groups else "noop", broker_user),
                timeout_s=constants.RECONCILE_TIMEOUT_S if role == "reconcile" else constants.ESM_TIMEOUT_S,
                reserved_concurrency=(constants.RECONCILE_RESERVED_CONCURRENCY if role == "reconcile"
                                      else None),
                scope=scope,
            )
            read_secrets(fn, broker_user, self.data.redis_secret)
            if role == "reconcile":
                self._probe_user(fn)
            if starts_groups:
                ecs_pool_access(fn, cluster=self.workers.cluster, family=worker_family(self, pool.name),
                                task=self.workers.task_definitions[pool.name], spares_of=pool)
            if role in POOL_QUEUES:
                self._amazon_mq_source(scope, fn, pool, POOL_QUEUES[role])
            made[role] = fn
        return PoolFunctions(**made)

    def _probe_user(self, fn: lambda_.Function) -> None:
        """The dead-lettering probe runs as its own user in its own vhost: the one holder of
        ``policymaker`` (switchyard/rpc/control/access.py), so no pool's user may put policies."""
        secret = self.broker.user_secret(BrokerRole.PROBE)
        fn.add_environment(rpc.DEAD_LETTER_PROBE_VHOST.name, DEAD_LETTER_PROBE_VHOST)
        fn.add_environment(rpc.DEAD_LETTER_PROBE_SECRET_ARN.name, secret.secret_arn)
        read_secrets(fn, secret)

    def _amazon_mq_source(self, scope: Construct, fn: lambda_.Function, pool: PoolConfig,
                          suffix: str) -> None:
        """The Amazon MQ event source on ``{pool}-{suffix}``, made in ``scope`` (CDK has no L2 for it)."""
        fn.add_to_role_policy(
            iam.PolicyStatement(actions=["mq:DescribeBroker"], resources=[self.broker.broker.attr_arn])
        )
        event_source_network_access(fn)
        # The pollers log in as the pool's mappings user (read on its three queues) with this role.
        poller = self.broker.user_secret(BrokerRole.MAPPINGS, pool.name)
        read_secrets(fn, poller)
        mapping = lambda_.CfnEventSourceMapping(
            scope,
            f"{pool.name}-{suffix}-source",
            function_name=fn.function_name,
            event_source_arn=self.broker.broker.attr_arn,
            queues=[f"{pool.name}-{suffix}"],
            batch_size=pool.batch_size,
            maximum_batching_window_in_seconds=pool.batch_window_seconds,
            source_access_configurations=[
                lambda_.CfnEventSourceMapping.SourceAccessConfigurationProperty(
                    type="BASIC_AUTH", uri=poller.secret_arn
                ),
                lambda_.CfnEventSourceMapping.SourceAccessConfigurationProperty(type="VIRTUAL_HOST", uri="/"),
            ],
            enabled=True,
        )
        mapping.node.add_dependency(fn.role)  # the poller needs its permissions before it starts
        mapping.node.add_dependency(self.deploy["pools"])  # and the queue, declared by pool init

    # -- delay scheduler ---------------------------------------------------------------------------
    def _build_delay(self) -> dict[str, lambda_.Function]:
        d = self.config.delay
        # the fire loop warns past the same lateness SLA the alarm is set on
        env = {**self._kafka_env(), **self._postgres_env(),
               **environment({DELAY["lateness_sla_ms"]: d.lateness_sla_ms})}
        # role -> (timeout, reserved concurrency): enqueue runs per batch, fire and sweep loop.
        reserved = self.config.concurrency
        roles = {"enqueue": (constants.ESM_TIMEOUT_S, None),
                 "fire": (constants.LOOP_TIMEOUT_S, reserved.fire),
                 "sweep": (constants.LOOP_TIMEOUT_S, reserved.sweep)}
        enqueue, fire, sweep = (
            self.add_function(f"delay-{role}", f"delay_{role}", service=DELAY_SERVICE, environment=env,
                           timeout_s=timeout_s, reserved_concurrency=reserved)
            for role, (timeout_s, reserved) in roles.items()
        )
        for fn in (enqueue, fire, sweep):
            read_secrets(fn, self.data.postgres_secret)
        # enqueue publishes messages already due; fire publishes the rest; sweep only touches Postgres.
        kafka_access(enqueue, self.data.kafka.attr_arn, read=(d.input_topic,), write=(d.output_topic,))
        kafka_access(fire, self.data.kafka.attr_arn, write=(d.output_topic,))
        self._msk_source(enqueue, "delay-input-source", d.input_topic, DELAY_CONSUMER_GROUP,
                         d.batch_window_seconds, ("topics", "schema"))
        return {"enqueue": enqueue, "fire": fire, "sweep": sweep}

    def _build_kafka_failures(self) -> sqs.Queue:
        """Where the MSK mappings send a batch that exhausted its retries: its topic, partition and
        offsets (the records stay in the topic for its retention, to read and produce again)."""
        return sqs.Queue(self, constants.KAFKA_FAILURES_QUEUE_ID, encryption=sqs.QueueEncryption.SQS_MANAGED,
                         enforce_ssl=True,
                         retention_period=Duration.days(constants.KAFKA_FAILURES_RETENTION_DAYS))

    def _msk_source(self, fn: lambda_.Function, construct_id: str, topic: str, group: str,
                    window_s: int, after: tuple[str, ...]) -> None:
        """An MSK event source on ``topic`` in consumer group ``group``, reporting batch item failures,
        in provisioned mode (partial batch response needs it): one invocation per partition at most.
        Retries are bounded (``KAFKA_RETRY_ATTEMPTS``), then the batch goes to ``kafka_failures``.
        It starts after ``fn``'s role and the deploy resources named in ``after``."""
        event_source_network_access(fn)
        self.kafka_failures.grant_send_messages(fn)
        d = self.config.delay
        mapping = lambda_.CfnEventSourceMapping(
            self,
            construct_id,
            function_name=fn.function_name,
            event_source_arn=self.data.kafka.attr_arn,
            topics=[topic],
            starting_position=d.starting_position,
            batch_size=d.batch_size,
            maximum_batching_window_in_seconds=window_s,
            function_response_types=["ReportBatchItemFailures"],
            maximum_retry_attempts=constants.KAFKA_RETRY_ATTEMPTS,
            destination_config=lambda_.CfnEventSourceMapping.DestinationConfigProperty(
                on_failure=lambda_.CfnEventSourceMapping.OnFailureProperty(
                    destination=self.kafka_failures.queue_arn)),
            provisioned_poller_config=lambda_.CfnEventSourceMapping.ProvisionedPollerConfigProperty(
                minimum_pollers=constants.DELAY_MIN_POLLERS,
                maximum_pollers=max(constants.DELAY_MIN_POLLERS,
                                    -(-d.partitions // constants.KAFKA_INVOCATIONS_PER_POLLER)),
                # Both MSK mappings share one group's event poller units (billed per EPU-hour).
                poller_group_name=physical_name(self, constants.MSK_POLLER_GROUP_SUFFIX),
            ),
            amazon_managed_kafka_event_source_config=(
                lambda_.CfnEventSourceMapping.AmazonManagedKafkaEventSourceConfigProperty(consumer_group_id=group)
            ),
            enabled=True,
        )
        mapping.node.add_dependency(fn.role)
        for resource in after:
            mapping.node.add_dependency(self.deploy[resource])

    # -- scheduled calls ---------------------------------------------------------------------------
    def _build_scheduled(self) -> lambda_.Function:
        """The scheduled-call relay: an MSK mapping on the delay output topic (its own consumer group),
        publishing fired calls into every pool's request exchange as the ``scheduled`` broker user, and
        parking calls for no pool in the delay store."""
        d = self.config.delay
        user = self.broker.user_secret(BrokerRole.SCHEDULED)
        fn = self.add_function(
            "scheduled-relay", "rpc_scheduled", service=SCHEDULED_SERVICE, timeout_s=constants.ESM_TIMEOUT_S,
            environment={**self._kafka_env(), **self._postgres_env(), **self._amqp_env(user)},
        )
        read_secrets(fn, user, self.data.postgres_secret)
        kafka_access(fn, self.data.kafka.attr_arn, read=(d.output_topic,), group=SCHEDULED_CONSUMER_GROUP)
        # a fired call waits for no batch (window 0)
        self._msk_source(fn, "scheduled-source", d.output_topic, SCHEDULED_CONSUMER_GROUP, 0,
                         ("topics", "schema", "pools"))
        return fn

    # -- schedules -----------------------------------------------------------------------------------
    def _build_schedules(self) -> dict[str, scheduler.Schedule]:
        """One minute each (EventBridge's finest); each function loops inside its invocation."""
        wanted = {f"{name}-reconcile": (pool_scope(self, name), fns.reconcile)
                  for name, fns in self.pools.items()}
        if self.delay:
            wanted.update({f"delay-{role}": (self, self.delay[role]) for role in ("fire", "sweep")})
        schedules = {}
        for name, (scope, fn) in wanted.items():
            schedules[name] = scheduler.Schedule(
                scope,
                f"{name}-schedule",
                schedule=scheduler.ScheduleExpression.rate(Duration.minutes(constants.SCHEDULE_RATE_MINUTES)),
                # A missed tick is not retried: the next one comes within the minute.
                target=targets.LambdaInvoke(fn, retry_attempts=0, max_event_age=Duration.minutes(1)),
                description=f"Switchyard {name}: every minute (EventBridge Scheduler's finest rate)",
            )
            # Deleted before the pools resource stops the workers: no tick starts a group after it.
            if "pools" in self.deploy:
                schedules[name].node.add_dependency(self.deploy["pools"])
        return schedules
