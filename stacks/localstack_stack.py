"""The ``localstack`` target: what LocalStack's community edition can host, from the AWS target's constructs.

Deployed (``python -m scripts.localstack_deploy``): the configuration parameters and the broker secret a
process reads at start, an IAM role that may read them, the alarms over Switchyard's own metrics
with their SNS topic, and the pipeline's bucket. The alarms on EMF metrics use 10 s periods; the two
on Metrics Insights queries (queue depth, dead-lettering stranded) 60 s, since Metrics Insights
aggregates by the minute. Left out, because LocalStack cannot host them (no VPC-bound Amazon MQ,
MSK, RDS, ElastiCache, ECS or EMR Serverless; Lambda functions cannot run without Docker, and so
neither can the schedules that invoke them; its CloudFormation has no provider for
``AWS::CloudWatch::Dashboard``, so a dashboard would report CREATE_COMPLETE and not exist): the local
services stand in (RabbitMQ, tansu, Postgres, Redis; ``scripts/services.sh``), and their addresses
are written into the same parameters and secret the functions read on AWS. The local runtime
(``switchyard local --stack``) plays the event sources and the schedules.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from aws_cdk import CfnOutput, Duration, RemovalPolicy, SecretValue, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from stacks import constants
from stacks.analytics import pipeline_bucket
from stacks.config import DeploymentConfig
from stacks.monitoring import MonitoringConstruct
from stacks.names import alarm_name
from stacks.parameters import ConfigParametersConstruct, ServiceEndpoints, chosen_endpoints
from switchyard.core.config import Connections

LOCAL_BROKER_CREDENTIALS = {"username": "guest", "password": "guest"}  # the local RabbitMQ's user


def _with_placeholders(url: str) -> str:
    """``url`` with its user and password replaced by the placeholders its secret fills."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{{username}}:{{password}}@{host}"))


def local_endpoints(broker_secret: secretsmanager.ISecret, config: DeploymentConfig) -> ServiceEndpoints:
    """The local services (their defaults in ``switchyard.core.config.Connections``) the chosen parts
    use (switchyard:parts), broker credentials from ``broker_secret`` as on AWS."""
    local = Connections()
    return chosen_endpoints(
        config,
        broker=lambda: {"amqp_url": _with_placeholders(local.amqp_url),
                        "management_url": _with_placeholders(local.management_url),
                        "amqp_secret": broker_secret},
        redis=lambda: {"redis_url": local.redis_url},
        delay=lambda: {"postgres_dsn": local.postgres_dsn, "kafka_bootstrap": local.kafka_bootstrap})


class LocalStackTargetStack(Stack):
    """``broker_secret``, ``endpoints``, ``parameters``, ``runtime_role``, ``monitoring``, ``bucket``."""

    def __init__(self, scope: Construct, construct_id: str = constants.LOCALSTACK_STACK_ID,
                 **kwargs: Any) -> None:
        kwargs.setdefault("description", constants.LOCALSTACK_STACK_DESCRIPTION)
        super().__init__(scope, construct_id, **kwargs)
        self.config = DeploymentConfig.from_context(self)
        self.broker_secret = secretsmanager.Secret(
            self,
            constants.BROKER_SECRET_ID,
            description="The local RabbitMQ's user (username/password JSON), as Amazon MQ's admin secret",
            secret_string_value=SecretValue.unsafe_plain_text(json.dumps(LOCAL_BROKER_CREDENTIALS)),
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.endpoints = local_endpoints(self.broker_secret, self.config)
        self.parameters = ConfigParametersConstruct(self, constants.CONFIG_CONSTRUCT_ID,
                                                    values=self.endpoints.shared_env(self.config.delay))
        self.runtime_role = iam.Role(
            self,
            "RuntimeRole",
            assumed_by=iam.AccountRootPrincipal(),
            description="What a Switchyard function reads at start: the configuration path and its secrets",
        )
        self.parameters.grant_read(self.runtime_role)
        for secret in self.endpoints.secrets():
            secret.grant_read(self.runtime_role)
        self.monitoring = MonitoringConstruct(self, constants.MONITORING_CONSTRUCT_ID, config=self.config,
                                              period=Duration.seconds(constants.LOCALSTACK_ALARM_PERIOD_S),
                                              encrypt_topic=False, dashboard=False)
        self.bucket = pipeline_bucket(self, "Pipeline")
        outputs = {
            "ConfigPath": self.parameters.path,
            "BrokerSecretArn": self.broker_secret.secret_arn,
            "RuntimeRoleArn": self.runtime_role.role_arn,
            "AlarmTopicArn": self.monitoring.topic.topic_arn,
            "PipelineBucket": self.bucket.bucket_name,
            "AlarmNames": ",".join(sorted(alarm_name(self, n) for n in self.monitoring.alarms)),
        }
        for name, value in outputs.items():
            CfnOutput(self, name, value=value)
