"""Amazon MQ for RabbitMQ: the request router of keyed RPC."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Fn, RemovalPolicy
from aws_cdk import aws_amazonmq as amazonmq
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from stacks import constants, sizes
from stacks.names import broker_users_secret_prefix, physical_name
from stacks.network import allow_from
from switchyard.rpc.control.access import BrokerRole, BrokerUser, deployment_users
from switchyard.rpc.protocol import validate_application


@dataclass(frozen=True)
class BrokerSettings:
    """What differs between deployments, read from CDK context (see ``from_context``)."""

    engine_version: str = constants.DEFAULT_BROKER_ENGINE_VERSION
    instance_type: str = constants.DEFAULT_BROKER_INSTANCE_TYPE
    deployment_mode: str = constants.DEFAULT_BROKER_DEPLOYMENT_MODE
    # Applications with a clients user of their own, limited to their own durable reply queues.
    applications: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for application in self.applications:
            validate_application(application)
        if self.deployment_mode not in constants.BROKER_DEPLOYMENT_MODES:
            raise ValueError(
                f"{constants.CTX_BROKER_DEPLOYMENT_MODE} must be one of {constants.BROKER_DEPLOYMENT_MODES}, "
                f"got {self.deployment_mode!r}"
            )
        if self.engine_version.startswith("4.") and not self.instance_type.startswith("mq.m7g."):
            raise ValueError(
                f"Amazon MQ runs RabbitMQ {self.engine_version} only on mq.m7g instance types, "
                f"got {self.instance_type!r}"
            )

    @classmethod
    def from_context(cls, scope: Construct) -> BrokerSettings:
        def ctx(key: str, default: str) -> str:
            value = sizes.context(scope, key)  # the key's, else its switchyard:size's (stacks/sizes.py)
            return default if value in (None, "") else str(value)

        return cls(
            engine_version=ctx(constants.CTX_BROKER_ENGINE_VERSION, constants.DEFAULT_BROKER_ENGINE_VERSION),
            instance_type=ctx(constants.CTX_BROKER_INSTANCE_TYPE, constants.DEFAULT_BROKER_INSTANCE_TYPE),
            deployment_mode=ctx(constants.CTX_BROKER_DEPLOYMENT_MODE,
                                constants.DEFAULT_BROKER_DEPLOYMENT_MODE),
            applications=_names(scope.node.try_get_context(constants.CTX_BROKER_APPLICATIONS)),
        )


def _names(value: object) -> tuple[str, ...]:
    """A context value given as a list or as a comma-separated string (``-c key=a,b``)."""
    if value in (None, ""):
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ValueError(f"{constants.CTX_BROKER_APPLICATIONS} must be a list of names, got {value!r}")
    return tuple(str(item).strip() for item in items)


class BrokerConstruct(Construct):
    """A private Amazon MQ for RabbitMQ broker with its admin secret and security group.

    Attributes for the constructs that come next:
    - ``broker``: the ``CfnBroker`` (``broker.attr_arn`` for Lambda event source mappings,
      ``broker.attr_amqp_endpoints`` for clients);
    - ``secret``: admin credentials (JSON ``username``/``password``): the pools custom resource's alone;
    - ``users``: one secret per role's broker user (switchyard/rpc/control/access.py; ``user_secret``), which
      that custom resource makes on the broker: the functions, mappings, workers and clients use these;
    - ``security_group``: the broker's group, open on AMQPS 5671 and HTTPS 443 (management API)
      to the client groups only, and to itself: event source mappings run their pollers in the
      broker's subnets with this group, so it also keeps all outbound traffic allowed.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        clients: Sequence[ec2.ISecurityGroup],
        settings: BrokerSettings | None = None,
        pools: Sequence[str] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        self.vpc = vpc
        self.clients = tuple(clients)
        self.settings = settings or BrokerSettings.from_context(self)
        self.subnets = vpc.select_subnets(
            subnet_type=subnets.subnet_type,
            subnet_group_name=subnets.subnet_group_name,
        )
        self.security_group = self._build_security_group()
        self.secret = self._build_secret()
        self.users = {user: self._build_user_secret(user)
                      for user in deployment_users(pools, self.settings.applications)}
        self.broker = self._build_broker()

    def _build_security_group(self) -> ec2.SecurityGroup:
        group = ec2.SecurityGroup(
            self,
            constants.BROKER_SECURITY_GROUP_ID,
            vpc=self.vpc,
            description="Amazon MQ for RabbitMQ: AMQPS and the management API from the Switchyard parts",
            allow_all_outbound=True,
        )
        allow_from(group, constants.AMQPS_PORT, "AMQPS", *self.clients, group)
        allow_from(group, constants.HTTPS_PORT, "RabbitMQ management API", *self.clients, group)
        return group

    def _build_secret(self) -> secretsmanager.Secret:
        return self._credentials(constants.BROKER_SECRET_ID, constants.BROKER_ADMIN_USERNAME,
                                 "Amazon MQ for RabbitMQ admin user (username/password JSON)")

    def _build_user_secret(self, user: BrokerUser) -> secretsmanager.Secret:
        owner = user.pool or (f"app-{user.application}" if user.application else "all")
        return self._credentials(f"User-{owner}-{user.role}", user.username,
                                 f"RabbitMQ user of the {user.role} role (switchyard/rpc/control/access.py)",
                                 name=f"{broker_users_secret_prefix(self)}{owner}-{user.role}")

    def _credentials(self, construct_id: str, username: str, description: str,
                     name: str | None = None) -> secretsmanager.Secret:
        """A ``username``/generated ``password`` JSON secret (named ``name``, if given)."""
        return secretsmanager.Secret(
            self,
            construct_id,
            secret_name=name,
            description=description,
            generate_secret_string=secretsmanager.SecretStringGenerator(
                secret_string_template=json.dumps({"username": username}),
                generate_string_key="password",
                exclude_characters=constants.BROKER_PASSWORD_EXCLUDED_CHARACTERS,
                include_space=False,
                password_length=constants.BROKER_PASSWORD_LENGTH,
            ),
            removal_policy=RemovalPolicy.DESTROY,
        )

    def user_secret(self, role: BrokerRole, pool: str | None = None) -> secretsmanager.Secret:
        """The secret of ``role``'s user (of ``pool``; none for the clients)."""
        return self.users[BrokerUser(role, pool)]

    def _subnet_ids(self) -> list[str]:
        ids = list(self.subnets.subnet_ids)
        # A single-instance broker takes exactly one subnet; a cluster spreads over all of them.
        return ids[:1] if self.instances == 1 else ids

    @property
    def instances(self) -> int:
        """The broker instances (nodes) the deployment mode runs, and bills."""
        return constants.BROKER_INSTANCES[self.settings.deployment_mode]

    def _build_broker(self) -> amazonmq.CfnBroker:
        s = self.settings
        return amazonmq.CfnBroker(
            self,
            constants.BROKER_ID,
            broker_name=physical_name(self, constants.BROKER_NAME_SUFFIX,
                                      max_length=constants.BROKER_NAME_CHARS),
            engine_type=constants.BROKER_ENGINE,
            engine_version=s.engine_version,
            host_instance_type=s.instance_type,
            deployment_mode=s.deployment_mode,
            publicly_accessible=False,
            subnet_ids=self._subnet_ids(),
            security_groups=[self.security_group.security_group_id],
            # Amazon MQ requires automatic minor upgrades from RabbitMQ 3.13 on.
            auto_minor_version_upgrade=True,
            maintenance_window_start_time=amazonmq.CfnBroker.MaintenanceWindowProperty(
                day_of_week=constants.BROKER_MAINTENANCE_DAY,
                time_of_day=constants.BROKER_MAINTENANCE_TIME,
                time_zone=constants.BROKER_MAINTENANCE_TIME_ZONE,
            ),
            logs=amazonmq.CfnBroker.LogListProperty(general=True),
            users=[
                amazonmq.CfnBroker.UserProperty(
                    username=self.secret.secret_value_from_json("username").unsafe_unwrap(),
                    password=self.secret.secret_value_from_json("password").unsafe_unwrap(),
                )
            ],
        )

    @property
    def host_port(self) -> str:
        """``b-....mq.<region>.amazonaws.com:5671`` of the first AMQPS endpoint (a deploy-time token)."""
        return Fn.select(1, Fn.split("://", Fn.select(0, self.broker.attr_amqp_endpoints)))

    @property
    def amqp_url_template(self) -> str:
        """The AMQPS URL with ``{username}``/``{password}`` placeholders (switchyard/core/aws_secrets.py)."""
        return Fn.join("", ["amqps://{username}:{password}@", self.host_port, "/%2F"])

    @property
    def management_url_template(self) -> str:
        """The management API (HTTPS 443 on the broker's host) with credential placeholders."""
        return Fn.join("", ["https://{username}:{password}@", Fn.select(0, Fn.split(":", self.host_port))])
