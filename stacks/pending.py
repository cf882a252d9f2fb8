"""The pending request queue on AWS (issue 11): the node API Lambda behind API Gateway (REST), the
polling services' tokens in Secrets Manager, the streams bucket, and the alarms; on the
deployment's ElastiCache.

The function is ``functions/pending_api.py`` (the Powertools resolver ``switchyard pending serve``
runs locally). API Gateway ends an integration at 29 s; the long poll answers before the Lambda's
remaining time minus 2 s, and the function's timeout is the integration's. Polling services
authenticate with a bearer token per endpoint: the JSON secret ``{"endpoint": "token", ...}``
(one generated example entry; add one per polling service), re-read by the function every 5 min.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks import constants, nag
from stacks.data import DataConstruct
from stacks.functions import FunctionsConstruct
from stacks.grants import read_secrets
from stacks.monitoring import AlarmSpec, MonitoringConstruct, errors_or_throttles
from stacks.names import metrics_namespace, physical_name
from stacks.parameters import environment
from stacks.secrets import generated_secret
from switchyard.pending import metrics as pending_metrics
from switchyard.pending.settings import PENDING, TOKENS_SECRET_ARN

API_TIMEOUT_S = 29  # API Gateway REST's integration limit; the function's timeout matches it
STREAMS_PREFIX = "streams/"
STREAMS_EXPIRE_DAYS = 1  # streams live as long as a call (minutes); leftovers of crashed callers go
THROTTLE_RATE, THROTTLE_BURST = 2000, 1000  # requests/s over the whole API (polls + responses)
REDIS_RETRY_WINDOW_S = 20
EXAMPLE_ENDPOINT = "example"  # the secret's first entry; add one per polling service
PENDING_CONSTRUCT_ID = "Pending"


class PendingConstruct(Construct):
    """``tokens`` (secret), ``bucket`` (streams), ``function``, ``api`` and the pending alarms."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        data: DataConstruct,
        functions: FunctionsConstruct,
        monitoring: MonitoringConstruct,
    ) -> None:
        super().__init__(scope, construct_id)
        self.tokens = generated_secret(
            self, "Tokens", key=EXAMPLE_ENDPOINT, length=48, include_space=None,
            description="Pending queue: polling services' bearer tokens, a JSON object {endpoint: token}")
        self.bucket = s3.Bucket(
            self,
            "Streams",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(STREAMS_EXPIRE_DAYS),
                                              abort_incomplete_multipart_upload_after=Duration.days(1))],
            removal_policy=RemovalPolicy.DESTROY,  # streams only live for a call
            auto_delete_objects=True,  # emptied on delete, or `cdk destroy` fails on a non-empty bucket
        )
        self.function = functions.add_function(  # the one factory: layer, VPC, Powertools, X-Ray, logs
            "PendingApi",
            "pending_api",
            service="switchyard-pending",
            timeout_s=API_TIMEOUT_S,
            # Each long poll holds an execution up to 25 s: without a bound one tenant's idle polls could
            # take the account's concurrency. The reservation caps the function (switchyard:concurrency
            # pendingApi, in the account budget synth checks); within it one endpoint holds at most
            # SWITCHYARD_PENDING_MAX_POLLS polls (the API answers 429 past them).
            reserved_concurrency=functions.config.concurrency.pending_api,
            public=True,
            environment={
                **functions.redis_env(),
                **environment({
                    TOKENS_SECRET_ARN: self.tokens.secret_arn,
                    PENDING["store"]: f"s3://{self.bucket.bucket_name}/{STREAMS_PREFIX}",
                    # Redis retries must give up before API Gateway does (29 s): a clear 503, not a 504.
                    PENDING["retry_window_s"]: REDIS_RETRY_WINDOW_S,
                }),
            },
        )
        read_secrets(self.function, data.redis_secret, self.tokens)
        self.bucket.grant_read_write(self.function, f"{STREAMS_PREFIX}*")
        access_logs = logs.LogGroup(self, "ApiAccessLogs", retention=logs.RetentionDays.ONE_MONTH,
                                    removal_policy=RemovalPolicy.DESTROY)
        self.api = apigw.LambdaRestApi(
            self,
            "Api",
            rest_api_name=physical_name(self, "pending"),
            description="Pending queue node API: polling services long-poll their endpoint here",
            handler=self.function,
            proxy=True,
            integration_options=apigw.LambdaIntegrationOptions(timeout=Duration.seconds(API_TIMEOUT_S)),
            endpoint_types=[apigw.EndpointType.REGIONAL],
            cloud_watch_role=False,  # the account's setting, as the bus API's (stacks/bus.py)
            deploy_options=apigw.StageOptions(
                stage_name="v1",
                tracing_enabled=True,
                throttling_rate_limit=THROTTLE_RATE,
                throttling_burst_limit=THROTTLE_BURST,
                logging_level=apigw.MethodLoggingLevel.ERROR,
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=False, http_method=True, ip=True, protocol=True, request_time=True,
                    resource_path=True, response_length=True, status=True, user=False),
            ),
        )
        self.alarms = [monitoring.add_alarm(spec) for spec in self._specs()]
        self._acknowledge()

    def _sum(self, metric: str, label: str) -> cw.MathExpression:
        """``metric`` summed over every endpoint (Metrics Insights: endpoints come and go)."""
        return cw.MathExpression(
            expression=f'SELECT SUM({metric}) FROM SCHEMA("{metrics_namespace(self)}", Endpoint)',
            label=label,
            period=Duration.minutes(constants.ALARM_PERIOD_MINUTES),
        )

    def _specs(self) -> list[AlarmSpec]:
        return [
            AlarmSpec(
                "pending-pickup-timeouts",
                self._sum(pending_metrics.PENDING_PICKUP_TIMEOUTS, "requests nobody picked up in time"),
                1,
                "A request waited the whole pickup timeout (2 min by default) and was taken back: its "
                "polling service is not polling (down, wrong token, connected to no node).",
                ),
            AlarmSpec(
                "pending-abandoned-responses",
                self._sum(pending_metrics.PENDING_RESPONSES_UNDELIVERED, "responses with no caller left"),
                5,
                "Responses dropped because the caller cancelled, stopped heartbeating or the request was "
                "lost: a few happen when callers give up; five in a period means callers die or time out.",
                ),
            AlarmSpec(
                "pending-processors-lost",
                self._sum(pending_metrics.PENDING_PROCESSORS_LOST,
                          "requests whose processing node went silent"),
                1,
                "A node processing a request stopped heartbeating for 60 s: the caller got an error.",
                ),
            AlarmSpec(
                "pending-data-loss",
                self._sum(pending_metrics.PENDING_DATA_LOSS_EVENTS, "Redis data-loss detections"),
                1,
                "A node's data-loss guard vanished from Redis (failover without replication, flush, "
                "eviction): every in-flight pending request failed.",
                ),
            errors_or_throttles("pending-api", self.function),
        ]

    def _acknowledge(self) -> None:
        nag.accept(self.bucket, "S1", "Streams live for one call and expire within a day; a server-access-"
                   "log bucket would outlive them. The bucket is private and TLS-only.")
        for action in ("s3:Abort*", "s3:DeleteObject*", "s3:GetBucket*", "s3:GetObject*", "s3:List*"):
            nag.accept(self.function, f"IAM5[Action::{action}]",
                       "CDK's grantReadWrite on the streams prefix of the pending queue's own bucket.")
        nag.accept(self.function, f"IAM5[Resource::<{self._logical(self.bucket)}.Arn>/{STREAMS_PREFIX}*]",
                   "Every stream object under the streams prefix (ids are random per stream).")
        nag.accept(self.api, "APIG2", "The one Lambda validates every request body and answers 400 with a "
                   "message (tests/pending/test_api.py); a model here would duplicate it.")
        for rule_id in ("APIG4", "COG4"):
            nag.accept(self.api, rule_id, "Polling services authenticate with a bearer token per endpoint, "
                       "checked by the function in constant time against the Secrets Manager secret.")
        nag.accept(self.api, "APIG3", "No WAF: the API's callers are the operator's polling services with "
                   "per-endpoint tokens; stage throttling bounds the request rate.")
        nag.accept(self.tokens, "SMG4", "Tokens are rotated by writing a new value for an endpoint (the "
                   "function re-reads the secret every 5 minutes); no external system holds them.")

    def _logical(self, construct: Construct) -> str:
        return Stack.of(self).get_logical_id(construct.node.default_child)  # type: ignore[arg-type]
