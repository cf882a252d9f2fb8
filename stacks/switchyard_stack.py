"""The Switchyard stack: constructs composed in dependency order."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, CfnResource, Stack
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from stacks import constants
from stacks.analytics import AnalyticsConstruct
from stacks.broker import BrokerConstruct
from stacks.bus import BUS_CONSTRUCT_ID, BusConstruct
from stacks.config import ConfigError, DeploymentConfig
from stacks.constants import PART_BUS, PART_DELAY, PART_PENDING, PART_RPC, PART_SPARK
from stacks.data import DataConstruct, chosen
from stacks.functions import FunctionsConstruct
from stacks.log_retention import retain_unmanaged_logs
from stacks.monitoring import AwsResources, MonitoringConstruct
from stacks.names import dashboard_name
from stacks.network import NetworkConstruct
from stacks.parameters import ConfigParametersConstruct, ServiceEndpoints, chosen_endpoints
from stacks.pending import PENDING_CONSTRUCT_ID, PendingConstruct
from stacks.pool_stacks import pool_stacks
from stacks.workers import WorkersConstruct
from switchyard.rpc.control.access import BrokerRole


class SwitchyardStack(Stack):
    """Network, broker, data services, ECS workers, Lambda functions, monitoring, EMR Serverless.

    The configuration (pools, delay, sizes) comes from CDK context and is validated first, so a
    bad value fails synth before any construct is made.
    """

    def __init__(self, scope: Construct, construct_id: str = constants.STACK_ID, **kwargs: Any) -> None:
        kwargs.setdefault("description", constants.STACK_DESCRIPTION)
        super().__init__(scope, construct_id, **kwargs)
        self.nests_pools = True  # each pool's resources in a nested stack of its own (stacks/pool_stacks.py)
        self.config = DeploymentConfig.from_context(self)
        layer_dir = self.node.try_get_context(constants.CTX_LAYER_DIR) or constants.LAYER_DIR
        has = self.config.has
        self.network = NetworkConstruct(self, constants.NETWORK_CONSTRUCT_ID,
                                        nat_gateways=self.config.nat_gateways)
        # Each part brings only its own resources (switchyard:parts; stacks/config.py checks the needs).
        self.broker = BrokerConstruct(
            self, constants.BROKER_CONSTRUCT_ID, vpc=self.network.vpc, subnets=self.network.egress_subnets,
            clients=[self.network.functions_sg, self.network.workers_sg],  # EMR's: AnalyticsConstruct
            pools=[pool.name for pool in self.config.pools]) if has(PART_RPC) else None
        self.data = DataConstruct(self, constants.DATA_CONSTRUCT_ID, network=self.network, config=self.config)
        self.endpoints = self._endpoints()
        self.workers = WorkersConstruct(
            self, constants.WORKERS_CONSTRUCT_ID, network=self.network, broker=self.broker,
            config=self.config, endpoints=self.endpoints) if self.config.ecs_needed else None
        # The callers' default timeout on AWS outlives a new key's wait for a Fargate task.
        rpc_env = self.workers.rpc_env if self.workers and has(PART_RPC) else {}
        self.parameters = ConfigParametersConstruct(self, constants.CONFIG_CONSTRUCT_ID, values={
            **self.endpoints.shared_env(self.config.delay), **rpc_env})
        self.functions = FunctionsConstruct(
            self, constants.FUNCTIONS_CONSTRUCT_ID, network=self.network, broker=self.broker, data=self.data,
            workers=self.workers, config=self.config, endpoints=self.endpoints, parameters=self.parameters,
            layer_dir=str(layer_dir))
        self.monitoring = MonitoringConstruct(
            self, constants.MONITORING_CONSTRUCT_ID, config=self.config,
            aws=AwsResources(functions=self.functions, data=self.data, workers=self.workers,
                             broker=self.broker))
        self.analytics = AnalyticsConstruct(
            self, constants.ANALYTICS_CONSTRUCT_ID, network=self.network, broker=self.functions.broker,
            data=self.data, functions=self.functions, config=self.config) if has(PART_SPARK) else None
        self.bus = BusConstruct(self, BUS_CONSTRUCT_ID, network=self.network, data=self.data,
                                workers=self.functions.workers, functions=self.functions,
                                monitoring=self.monitoring) if has(PART_BUS) else None
        self.pending = PendingConstruct(self, PENDING_CONSTRUCT_ID, data=self.data, functions=self.functions,
                                        monitoring=self.monitoring) if has(PART_PENDING) else None
        self._build_outputs()
        retain_unmanaged_logs(self, apis=[part.api for part in (self.bus, self.pending) if part is not None],
                              broker=self.broker.broker if self.broker else None)
        self.config.concurrency.check_reserved(self.reserved_concurrency(), self.config.account_concurrency)
        self.check_resource_count()

    def _endpoints(self) -> ServiceEndpoints:
        """The deployed parts' services: the broker (rpc), Redis (rpc, pending, bus), Postgres and MSK
        (delay); a service no chosen part uses is left out of every environment and parameter."""
        def broker() -> dict[str, Any]:
            # The deployed configuration's broker user is the clients' (the EMR job, an operator's
            # calls); each function and worker names its own role's secret in its environment.
            rpc = chosen(self.broker, PART_RPC)
            return {"amqp_url": rpc.amqp_url_template, "management_url": rpc.management_url_template,
                    "amqp_secret": rpc.user_secret(BrokerRole.CLIENTS)}

        data = self.data
        return chosen_endpoints(
            self.config, broker=broker,
            redis=lambda: {"redis_url": data.redis_url_template, "redis_secret": data.redis_secret,
                           "redis_cluster": self.config.redis.cluster_mode},
            delay=lambda: {"postgres_dsn": data.postgres_dsn_template,
                           "postgres_secret": data.postgres_secret,
                           "kafka_bootstrap": data.kafka_bootstrap, "kafka_auth": "aws-msk-iam"})


    def resource_counts(self) -> dict[str, int]:
        """Resources per template: this stack's (by its name) and each pool's nested stack's."""
        counts = {stack.node.id: 0 for stack in (self, *pool_stacks(self))}
        for node in self.node.find_all():
            if isinstance(node, CfnResource):
                counts[Stack.of(node).node.id] += 1
        return counts

    def pool_resources_here(self) -> int:
        """What one pool adds to this stack, not to its nested one: its nested stack, its broker users."""
        if self.broker is None or not self.config.pools:
            return 0
        first = self.config.pools[0].name
        return 1 + sum(1 for user in self.broker.users if user.pool == first)

    def check_resource_count(self) -> None:
        """Fail synth with the number of pools that fit, rather than CloudFormation's bare count."""
        total = self.resource_counts()[self.node.id]  # a pool's nested stack holds a few dozen
        if total <= constants.CFN_MAX_RESOURCES:
            return
        pools = len(self.config.pools)
        per_pool = self.pool_resources_here()
        fit = (constants.CFN_MAX_RESOURCES - (total - per_pool * pools)) // max(1, per_pool)
        raise ConfigError(
            f"{constants.CTX_POOLS}: {pools} pools make {total} resources in this stack, over "
            f"CloudFormation's {constants.CFN_MAX_RESOURCES}: each pool adds {per_pool} here (its nested "
            "stack and broker user "
            f"secrets), so one stack holds at most {max(0, fit)} pools; deploy the others as a second "
            f"stack ({constants.CTX_STACKS}, docs/deployment.md \"Two stacks in one account\")")

    def reserved_concurrency(self) -> dict[str, int]:
        """Each function's reserved concurrency, by construct path: every reservation, whoever made it."""
        found = {}
        for node in self.node.find_all():
            if isinstance(node, lambda_.CfnFunction) and node.reserved_concurrent_executions is not None:
                path = node.node.path.removeprefix(f"{self.node.path}/").removesuffix("/Resource")
                found[path] = int(node.reserved_concurrent_executions)
        return found

    def _build_outputs(self) -> None:
        outputs = {"VpcId": self.network.vpc.vpc_id, "AlarmTopicArn": self.monitoring.topic.topic_arn,
                   "DashboardName": dashboard_name(self), "ConfigPath": self.parameters.path}
        if self.broker is not None:
            outputs.update({
                "BrokerArn": self.broker.broker.attr_arn,
                "BrokerSecretArn": self.broker.secret.secret_arn,
                "BrokerClientsSecretArn": self.broker.user_secret(BrokerRole.CLIENTS).secret_arn,
            })
        if self.config.has(PART_DELAY):
            outputs.update({
                "KafkaClusterArn": self.data.kafka.attr_arn,
                "KafkaBootstrapIam": self.data.kafka_bootstrap,
                "PostgresSecretArn": self.data.postgres_secret.secret_arn,
            })
        if self.workers is not None:
            outputs["EcsCluster"] = self.workers.cluster.cluster_name
        if self.analytics is not None:
            outputs.update({
                "PipelineBucket": self.analytics.bucket.bucket_name,
                "PipelineApplicationId": self.analytics.application.attr_application_id,
                "PipelineJobRoleArn": self.analytics.job_role.role_arn,
            })
        if self.bus is not None:
            outputs.update({"BusApiUrl": self.bus.api.url,
                            "BusRootKeySecretArn": self.bus.root_key.secret_arn})
        if self.pending is not None:
            outputs.update({"PendingApiUrl": self.pending.api.url,
                            "PendingTokensSecretArn": self.pending.tokens.secret_arn})
        for name, value in outputs.items():
            CfnOutput(self, name, value=value)
