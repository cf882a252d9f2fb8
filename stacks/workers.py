"""ECS: the cluster and, per pool, the Fargate task definition its worker groups run.

The control plane (``switchyard/rpc/drivers/ecs.py``) starts each worker with ``RunTask`` on the
pool's task definition and the worker protocol's variables as container overrides; this
construct only defines what every worker of the pool has in common: image, command, size, logs,
the AMQP credentials (injected by ECS from Secrets Manager, never in plain environment) and the
stop timeout of the two-stage stop (SIGTERM, then SIGKILL ``stopTimeout`` later).
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks import constants
from stacks.broker import BrokerConstruct
from stacks.config import DeploymentConfig, ImageDirectory, PoolConfig
from stacks.data import chosen
from stacks.names import metrics_namespace, physical_name
from stacks.network import NetworkConstruct, allow_from
from stacks.parameters import ServiceEndpoints, environment
from stacks.platform import fargate_platform, pool_image, worker_image
from stacks.pool_stacks import pool_scope
from switchyard.core.aws_secrets import INJECTED_FIELDS, source_variable
from switchyard.core.config import AMQP_URL
from switchyard.core.settings import LOG_LEVEL
from switchyard.rpc.control.access import BrokerRole
from switchyard.rpc.settings import CALL_TIMEOUT

REPO_ROOT = Path(__file__).resolve().parent.parent


def worker_family(scope: Construct, pool: str) -> str:
    """The task definition family of a pool (``SWITCHYARD_RPC_ECS_TASK_DEFINITION`` of its control plane)."""
    return physical_name(scope, f"{constants.WORKER_FAMILY_SUFFIX}{pool}")


class WorkersConstruct(Construct):
    """``cluster``, ``task_definitions[pool]`` and the shared ``log_group`` of the workers."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        network: NetworkConstruct,
        broker: BrokerConstruct | None,
        config: DeploymentConfig,
        endpoints: ServiceEndpoints,
    ) -> None:
        super().__init__(scope, construct_id)
        self.network = network
        self.broker = broker
        self.endpoints = endpoints
        if any(pool.min_spares for pool in config.pools):  # a spare registers and waits in Redis
            allow_from(network.redis_sg, constants.REDIS_PORT, "Redis over TLS from the spare workers",
                       network.workers_sg)
        # FARGATE and FARGATE_SPOT associated: RunTask's capacityProviderStrategy (the driver's, each
        # pool's capacityProvider) may only name providers associated with the cluster.
        self.cluster = ecs.Cluster(
            self, "Cluster", vpc=network.vpc, container_insights_v2=ecs.ContainerInsights.ENABLED,
            enable_fargate_capacity_providers=True,
        )
        self.log_group = logs.LogGroup(
            self, "WorkerLogs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
        )
        # The callers' default call timeout on AWS (the stack's configuration has it too): long enough
        # for a new key's first call to wait for its Fargate task (stacks/config.py checks it).
        self.rpc_env = environment({CALL_TIMEOUT: config.call_timeout_seconds})
        self.base_image = config.base_image_ref
        self._built_image: ecs.ContainerImage | None = None
        self._own_images: dict[str, ecs.ContainerImage] = {}
        self.task_definitions = {pool.name: self._task_definition(pool) for pool in config.pools}

    def _image(self, pool: PoolConfig) -> ecs.ContainerImage:
        if isinstance(pool.image, ImageDirectory):  # one asset per directory, however many pools use it
            if pool.image.directory not in self._own_images:
                self._own_images[pool.image.directory] = pool_image(pool.image.path, self.base_image)
            return self._own_images[pool.image.directory]
        if pool.image:
            return ecs.ContainerImage.from_registry(pool.image)
        if self._built_image is None:  # one asset (one build, one push) for every pool using it
            self._built_image = worker_image()
        return self._built_image

    def _task_definition(self, pool: PoolConfig) -> ecs.FargateTaskDefinition:
        broker = chosen(self.broker, constants.PART_RPC)
        secret = broker.user_secret(BrokerRole.WORKERS, pool.name)
        task = ecs.FargateTaskDefinition(
            pool_scope(self, pool.name),  # in the pool's nested stack
            f"Worker-{pool.name}",
            family=worker_family(self, pool.name),
            cpu=pool.cpu,
            memory_limit_mib=pool.memory_mib,
            runtime_platform=fargate_platform(),
        )
        task.add_container(
            constants.WORKER_CONTAINER,
            image=self._image(pool),
            command=["worker", "--handler", pool.handler],  # the image's entrypoint is `switchyard`
            essential=True,
            memory_limit_mib=pool.memory_mib,
            stop_timeout=Duration.seconds(constants.WORKER_STOP_TIMEOUT_S),
            logging=ecs.LogDrivers.aws_logs(stream_prefix=pool.name, log_group=self.log_group),
            environment={
                **environment({AMQP_URL: broker.amqp_url_template, LOG_LEVEL: constants.LOG_LEVEL}),
                **self.rpc_env,  # a handler that calls another pool waits as long as any caller
                "POWERTOOLS_SERVICE_NAME": f"switchyard-{pool.name}-worker",
                "POWERTOOLS_METRICS_NAMESPACE": metrics_namespace(self),
                "WORKER_POOL": pool.name,  # WORKER_KEY, WORKER_ID...: set per task by the driver
                **self._spare_env(pool),
            },
            # The pool's workers user (switchyard/rpc/control/access.py): request queues, replies, activity.
            secrets={**{source_variable("AMQP", field): ecs.Secret.from_secrets_manager(secret, field)
                        for field in INJECTED_FIELDS}, **self._spare_secrets(pool)},
        )
        return task

    def _spare_env(self, pool: PoolConfig) -> dict[str, str]:
        """A pool with spares: its workers reach Redis (a spare registers there and waits for a key)."""
        return self.endpoints.redis_settings() if pool.min_spares else {}

    def _spare_secrets(self, pool: PoolConfig) -> dict[str, ecs.Secret]:
        redis_secret = self.endpoints.redis_secret
        if not pool.min_spares or redis_secret is None:
            return {}
        field = "password"  # the AUTH token's secret holds only it (stacks/data.py)
        return {source_variable("REDIS", field): ecs.Secret.from_secrets_manager(redis_secret, field)}
