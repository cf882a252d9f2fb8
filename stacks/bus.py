"""The event bus on AWS (Routemaster): API Gateway (REST) + the ``bus_api`` function, the root key in
Secrets Manager, delivery workers as an ECS service, the housekeeping function on a schedule, and
the bus's alarms.

Workers are an ECS service (``switchyard bus worker``), not scheduled functions: delivery keeps
keep-alive connections to subscribers and blocks on the job queue, so a batch leaves within
milliseconds of being due, and a delivery to a slow subscriber (up to 20 s) is never cut off by the
end of an invocation. The housekeeping function (every minute) promotes due jobs, scrubs, autodrops
and reports telemetry, so alarms and autodrop go on while no worker runs. State is the stack's
ElastiCache (TLS + AUTH), under the bus's own hash-tagged key prefix.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from constructs import Construct

from stacks import constants, nag
from stacks.data import DataConstruct
from stacks.functions import FunctionsConstruct
from stacks.grants import read_secrets
from stacks.monitoring import PERIOD, AlarmSpec, MonitoringConstruct, errors_or_throttles
from stacks.names import metrics_namespace, physical_name
from stacks.network import NetworkConstruct, allow_from
from stacks.parameters import environment
from stacks.platform import fargate_platform, worker_image
from stacks.secrets import generated_secret
from stacks.workers import WorkersConstruct
from switchyard.bus import metrics as bus_metrics
from switchyard.bus import settings as bus
from switchyard.core.config import SECRET_SOURCES
from switchyard.core.observability import BUS_SERVICE
from switchyard.core.settings import LOG_LEVEL

REPO_ROOT = Path(__file__).resolve().parent.parent
BUS_CONSTRUCT_ID = "Bus"
BUS_NAME = "main"  # SWITCHYARD_BUS_NAME: the Redis hash tag of the bus's keys
BUS_WORKER_CPU = 512
BUS_WORKER_MEMORY_MIB = 1024
BUS_API_TIMEOUT_S = 29  # API Gateway REST's integration timeout
BUS_HOUSEKEEPING_TIMEOUT_S = 60
BUS_API_STAGE = "v1"
BUS_API_THROTTLE_RATE = 2000  # requests/s per stage; the burst below absorbs a publisher's spike
BUS_API_THROTTLE_BURST = 4000
UNHEALTHY_SUBSCRIBER_HP = 50  # 25 failures in a row with no success: backoff is already 0 s..1 min
BACKLOG_AGE_ALARM_MS = 300_000  # an event waiting 5 minutes: a subscriber is down or workers lag


class BusConstruct(Construct):
    """``root_key`` (secret), ``api`` (REST API), ``api_function``, ``housekeeping``, ``service``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        network: NetworkConstruct,
        data: DataConstruct,
        workers: WorkersConstruct,
        functions: FunctionsConstruct,
        monitoring: MonitoringConstruct,
    ) -> None:
        super().__init__(scope, construct_id)
        self.network, self.data, self.workers, self.functions = network, data, workers, functions
        self.root_key = generated_secret(
            self, "RootKey", key="root_key", length=48,
            description="Switchyard event bus root key (JSON root_key): manages the API tokens")
        env = {**functions.redis_env(), **environment({bus.NAME: BUS_NAME})}
        self.api_function = functions.add_function(
            "BusApi", "bus_api", service=BUS_SERVICE, timeout_s=BUS_API_TIMEOUT_S, public=True,
            # Every request, authenticated or not, is a paid invocation: the reservation caps what a
            # flood can run (and spend) beside the stage's throttle (switchyard:concurrency busApi).
            reserved_concurrency=functions.config.concurrency.bus_api,
            environment={**env, **environment({bus.SECRET_ARN: self.root_key.secret_arn})})
        read_secrets(self.api_function, data.redis_secret, self.root_key)
        self.housekeeping = functions.add_function(
            "BusHousekeeping", "bus_housekeeping", service=BUS_SERVICE, environment=env,
            timeout_s=BUS_HOUSEKEEPING_TIMEOUT_S,
            reserved_concurrency=constants.BUS_HOUSEKEEPING_RESERVED_CONCURRENCY)
        read_secrets(self.housekeeping, data.redis_secret)
        self.schedule = scheduler.Schedule(
            self,
            "bus-housekeeping-schedule",
            schedule=scheduler.ScheduleExpression.rate(Duration.minutes(constants.SCHEDULE_RATE_MINUTES)),
            target=targets.LambdaInvoke(self.housekeeping, retry_attempts=0,
                                        max_event_age=Duration.minutes(1)),
            description="Switchyard event bus housekeeping: every minute (EventBridge Scheduler's finest)",
        )
        self.api = self._build_api()
        self.service = self._build_workers()
        for spec in self._alarm_specs():
            monitoring.add_alarm(spec)
        self._acknowledge()

    def _build_api(self) -> apigw.LambdaRestApi:
        access_logs = logs.LogGroup(self, "ApiAccessLogs", retention=logs.RetentionDays.ONE_MONTH,
                                    removal_policy=RemovalPolicy.DESTROY)
        return apigw.LambdaRestApi(
            self,
            "Api",
            rest_api_name=physical_name(self, "bus"),
            handler=self.api_function,
            proxy=True,  # one resolver serves every route (switchyard/bus/api.py), as Routemaster's app
            description="Switchyard event bus: Routemaster's API",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            # The CloudWatch Logs role is an account and region setting, not this stack's: a role
            # made here would be named by the setting until the last stack that set it is destroyed,
            # and then every other stack's stage update fails. It is set once per account
            # (docs/deployment.md, "API Gateway's account setting"; ./dev deploy checks it).
            cloud_watch_role=False,
            deploy_options=apigw.StageOptions(
                stage_name=BUS_API_STAGE,
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=False, http_method=True, ip=True, protocol=True, request_time=True,
                    resource_path=True, response_length=True, status=True, user=False),
                logging_level=apigw.MethodLoggingLevel.ERROR,
                metrics_enabled=True,
                tracing_enabled=True,
                throttling_rate_limit=BUS_API_THROTTLE_RATE,
                throttling_burst_limit=BUS_API_THROTTLE_BURST,
            ),
        )

    def _build_workers(self) -> ecs.FargateService:
        task = ecs.FargateTaskDefinition(
            self,
            "WorkerTask",
            family=physical_name(self, "bus-worker"),
            cpu=BUS_WORKER_CPU,
            memory_limit_mib=BUS_WORKER_MEMORY_MIB,
            runtime_platform=fargate_platform(),
        )
        task.add_container(
            "bus-worker",
            image=worker_image(),
            command=["bus", "worker"],  # the image's entrypoint is `switchyard`
            essential=True,
            memory_limit_mib=BUS_WORKER_MEMORY_MIB,
            stop_timeout=Duration.seconds(constants.WORKER_STOP_TIMEOUT_S),  # in-flight deliveries finish
            logging=ecs.LogDrivers.aws_logs(stream_prefix="bus", log_group=self.workers.log_group),
            environment={
                **self.functions.endpoints.redis_settings(),  # the password: an ECS secret, below
                **environment({bus.NAME: BUS_NAME, LOG_LEVEL: constants.LOG_LEVEL}),
                "POWERTOOLS_SERVICE_NAME": BUS_SERVICE,
                "POWERTOOLS_METRICS_NAMESPACE": metrics_namespace(self),
                "POWERTOOLS_METRICS_DISABLED": "false",  # the CLI turns EMF off unless told otherwise
            },
            secrets={SECRET_SOURCES["REDIS"]["password"].name:
                     ecs.Secret.from_secrets_manager(self.data.redis_secret, "password")},
        )
        # Subscribers are anywhere on the internet (https): outbound open; inbound nothing.
        group = ec2.SecurityGroup(
            self, "DeliverySecurityGroup", vpc=self.network.vpc, allow_all_outbound=True,
            description="Switchyard event bus workers: Redis and the subscribers callbacks")
        allow_from(self.network.redis_sg, constants.REDIS_PORT, "Redis over TLS from the event bus workers",
                   group)
        provider = self.functions.config.bus.capacity_provider
        service = ecs.FargateService(
            self,
            "Workers",
            cluster=self.workers.cluster,
            task_definition=task,
            desired_count=self.functions.config.bus.workers,
            # FARGATE: the launch type, as before; FARGATE_SPOT: cheaper, a task may be stopped (the
            # cluster associates both providers, stacks/workers.py).
            capacity_provider_strategies=None if provider == "FARGATE" else [
                ecs.CapacityProviderStrategy(capacity_provider=provider, weight=1)],
            security_groups=[group],
            vpc_subnets=self.network.egress_subnets,
            min_healthy_percent=100,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
        )
        if provider != "FARGATE":  # a strategy may name only an associated provider: after the association
            service.node.add_dependency(self.workers.cluster)
        return service

    def _bus_metric(self, name: str, statistic: str) -> cw.Metric:
        return cw.Metric(namespace=metrics_namespace(self), metric_name=name, dimensions_map={"Bus": "all"},
                         statistic=statistic, period=PERIOD)

    def _alarm_specs(self) -> list[AlarmSpec]:
        dropped = cw.MathExpression(
            expression="DIFF(total)",
            using_metrics={"total": self._bus_metric(bus_metrics.BUS_EVENTS_AUTODROPPED_TOTAL, "Maximum")},
            label="bus: events autodropped", period=PERIOD)
        return [
            AlarmSpec(
                "bus-unhealthy-subscriber",
                self._bus_metric(bus_metrics.BUS_MIN_SUBSCRIBER_HEALTH, "Minimum"),
                UNHEALTHY_SUBSCRIBER_HP,
                f"A subscriber's health points fell below {UNHEALTHY_SUBSCRIBER_HP} (-2 per failed "
                "delivery, +1 per success): its callback has failed for a while and its events pile up.",
                comparison=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
                ),
            AlarmSpec(
                "bus-autodrop",
                dropped,
                1,
                "Redis ran short of memory and the oldest batches were deleted: those events are lost for "
                "their subscribers. Unsubscribe the dead subscriber or give Redis more memory.",
                ),
            AlarmSpec(
                "bus-backlog-age",
                self._bus_metric(bus_metrics.BUS_MAX_OLDEST_EVENT_AGE_MS, "Maximum"),
                BACKLOG_AGE_ALARM_MS,
                "An event has waited 5 minutes for delivery: a subscriber is down (see the health alarm) "
                "or the workers cannot keep up (scale the service).",
                periods=2,
                ),
            errors_or_throttles("bus-api", self.api_function),
            errors_or_throttles("bus-housekeeping", self.housekeeping),
        ]

    def _acknowledge(self) -> None:
        nag.accept(self.root_key, "SMG4", "The bus root key is a bearer credential that clients never hold "
                   "(only operators managing tokens): rotating it means updating those operators, not code.")
        nag.accept(self.api, "APIG2", "Requests are validated by the function's Powertools resolver against "
                   "the same OpenAPI models it documents (switchyard/bus/api.py); a proxy API has no models.")
        nag.accept(self.api, "APIG3", "Routemaster's API is called by known services with tokens; throttling "
                   "is set on the stage. A WAF web ACL is an account-level choice left to the operator.")
        nag.accept(self.api, "APIG4", "Authorization is Routemaster's: HTTP Basic with an API token, checked "
                   "by the function against Redis for every request (401 otherwise).")
        nag.accept(self.api, "COG4", "Clients authenticate with Routemaster's API tokens (HTTP Basic), which "
                   "existing publishers and subscribers send unchanged; Cognito would break them.")
        nag.accept(self.service.task_definition, "ECS2", "Only non-secret settings (the Redis URL template "
                   "without its password, names); the password is injected from Secrets Manager.")
        nag.accept(self.service.task_definition, "IAM5[Resource::*]", "ecr:GetAuthorizationToken has no "
                   "resource-level permissions (image pulls themselves are scoped to the asset repository).")
        push_logs = ("Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                     "AmazonAPIGatewayPushToCloudWatchLogs")
        nag.accept(self.api, f"IAM4[{push_logs}]", "API Gateway's own role for writing its execution logs "
                   "to CloudWatch (the account-level setting the stage's logging needs).")

