"""The deployed configuration: where the services are, as SSM parameters a process reads at start.

Both targets write the same thing: one String parameter per setting, named after its environment
variable, under ``/switchyard/<stack name>/config/`` (``switchyard.core.deployed_config.config_path``,
which reads them back). Only the settings every part shares go there (connection URLs with their
``{username}``/``{password}`` placeholders and the ARNs of the secrets that fill them, the Kafka
bootstrap, the delay scheduler's topics and schema); per-function settings (pool, driver) stay in
each function's environment. No secret value is ever a parameter.

``ServiceEndpoints`` is the one source of these settings: the AWS target builds it from the broker
and the data services, the LocalStack target from the local services, and the Lambda functions'
environments are built from it too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from stacks import constants
from stacks.config import ConfigError, DelayConfig, DeploymentConfig
from stacks.names import runtime_names
from switchyard.core.config import (
    AMQP_URL,
    KAFKA_AUTH,
    KAFKA_BOOTSTRAP,
    MANAGEMENT_URL,
    POSTGRES_DSN,
    REDIS_CLUSTER,
    REDIS_URL,
    SECRET_SOURCES,
    Setting,
)
from switchyard.core.deployed_config import CONFIG_PATH_ENV, VARIABLE_RE, config_path
from switchyard.delay.settings import DELAY

DELAY_CONSUMER_GROUP = "switchyard-delay"


def environment(values: Mapping[Setting[Any], object]) -> dict[str, str]:
    """A function's or task's variables from setting -> value: the names come from the declarations
    the parts read (switchyard.core.config.Setting), never typed here a second time."""
    return {setting.name: setting.text(value) for setting, value in values.items()}


def secret_arn_env(service: str, secret: secretsmanager.ISecret) -> dict[str, str]:
    """The variable that names ``service``'s secret (``AMQP``, ``POSTGRES``, ``REDIS``)."""
    return {SECRET_SOURCES[service]["secret_arn"].name: secret.secret_arn}
SCHEDULED_CONSUMER_GROUP = "switchyard-delay-scheduled"  # the relay's, on the output topic


@dataclass(frozen=True)
class ServiceEndpoints:
    """Connection settings of one target; a secret fills the placeholders of its service's URLs."""

    amqp_url: str = ""  # "": the stack does not deploy the service (switchyard:parts)
    management_url: str = ""
    redis_url: str = ""
    postgres_dsn: str = ""
    kafka_bootstrap: str = ""
    kafka_auth: str = "none"
    amqp_secret: secretsmanager.ISecret | None = None
    redis_secret: secretsmanager.ISecret | None = None
    postgres_secret: secretsmanager.ISecret | None = None
    redis_cluster: bool = False  # redis_url names a Redis Cluster's configuration endpoint

    @staticmethod
    def _with_secret(
        env: dict[str, str], service: str, secret: secretsmanager.ISecret | None
    ) -> dict[str, str]:
        return {**env, **secret_arn_env(service, secret)} if secret is not None else env

    def amqp_env(self) -> dict[str, str]:
        env = environment({AMQP_URL: self.amqp_url, MANAGEMENT_URL: self.management_url})
        return self._with_secret(env, "AMQP", self.amqp_secret)

    def redis_settings(self) -> dict[str, str]:
        """Where Redis is, without its credentials: the URL, and on a cluster the switch that makes
        every Redis user open a cluster client (whoever reads the URL reads both)."""
        cluster = {REDIS_CLUSTER: True} if self.redis_cluster else {}
        return environment({REDIS_URL: self.redis_url, **cluster})

    def redis_env(self) -> dict[str, str]:
        return self._with_secret(self.redis_settings(), "REDIS", self.redis_secret)

    def postgres_env(self) -> dict[str, str]:
        env = environment({POSTGRES_DSN: self.postgres_dsn})
        return self._with_secret(env, "POSTGRES", self.postgres_secret)

    def kafka_env(self, delay: DelayConfig) -> dict[str, str]:
        return environment({
            KAFKA_BOOTSTRAP: self.kafka_bootstrap,
            KAFKA_AUTH: self.kafka_auth,
            DELAY["input_topic"]: delay.input_topic,
            DELAY["output_topic"]: delay.output_topic,
            DELAY["schema"]: delay.schema,
            DELAY["consumer_group"]: DELAY_CONSUMER_GROUP,
        })

    def shared_env(self, delay: DelayConfig) -> dict[str, str]:
        """Every setting the deployed parts share: what the configuration parameters hold."""
        return {**(self.amqp_env() if self.amqp_url else {}), **(self.redis_env() if self.redis_url else {}),
                **(self.postgres_env() if self.postgres_dsn else {}),
                **(self.kafka_env(delay) if self.kafka_bootstrap else {})}

    def secrets(self) -> list[secretsmanager.ISecret]:
        return [s for s in (self.amqp_secret, self.redis_secret, self.postgres_secret) if s is not None]


def chosen_endpoints(config: DeploymentConfig, *, broker: Callable[[], dict[str, Any]],
                     redis: Callable[[], dict[str, Any]],
                     delay: Callable[[], dict[str, Any]]) -> ServiceEndpoints:
    """A target's endpoints of the services its chosen parts use (switchyard:parts): the broker's
    (rpc), Redis's (rpc, pending, bus), Postgres's and MSK's (delay); each callable gives its
    service's ``ServiceEndpoints`` fields and is called only when a chosen part uses it."""
    fields: dict[str, Any] = {}
    for used, part in ((config.has(constants.PART_RPC), broker), (config.redis_needed, redis),
                       (config.has(constants.PART_DELAY), delay)):
        if used:
            fields.update(part())
    return ServiceEndpoints(**fields)


class ConfigParametersConstruct(Construct):
    """``parameters`` (variable name -> ``StringParameter``) under ``path``; ``grant_read``."""

    def __init__(self, scope: Construct, construct_id: str, *, values: Mapping[str, str]) -> None:
        super().__init__(scope, construct_id)
        self.stack = Stack.of(self)
        self.path = config_path(self.stack.stack_name)
        self.values = {**values, **runtime_names(self)}  # and the stack's names that code reads
        bad = sorted(name for name in self.values if not VARIABLE_RE.match(name))
        if bad:
            raise ConfigError(f"configuration parameters must be named {VARIABLE_RE.pattern}, got {bad}")
        self.parameters = {
            name: ssm.StringParameter(
                self, name, parameter_name=f"{self.path}{name}", string_value=value,
                description=f"Switchyard setting {name} (read at start through {CONFIG_PATH_ENV})")
            for name, value in sorted(self.values.items())
        }

    def path_arns(self) -> list[str]:
        """The path itself (GetParametersByPath is authorized on it) and the parameters below it."""
        base = self.path.rstrip("/")
        return [self.stack.format_arn(service="ssm", resource="parameter", resource_name=name)
                for name in (base.lstrip("/"), f"{base.lstrip('/')}/*")]

    def grant_read(self, grantee: iam.IGrantable) -> None:
        """Read the whole path (Powertools ``get_parameters`` calls GetParametersByPath)."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["ssm:GetParametersByPath", "ssm:GetParameters", "ssm:GetParameter"],
            resource_arns=self.path_arns())
        if isinstance(grantee, Construct):  # cdk-nag (stacks/nag.py cannot be imported here: a cycle)
            wildcard = self.path_arns()[1].replace(self.stack.partition, "<AWS::Partition>").replace(
                self.stack.region, "<AWS::Region>").replace(self.stack.account, "<AWS::AccountId>")
            Validations.of(grantee).acknowledge(Acknowledgment(
                id=f"AwsSolutions::AwsSolutions-IAM5[Resource::{wildcard}]",
                reason="The deployment's own configuration parameters, every one under its one path."))
