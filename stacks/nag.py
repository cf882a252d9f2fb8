"""cdk-nag: AwsSolutions checks on the app, and the reason for every accepted finding.

cdk-nag 3 runs as a CDK policy-validation plugin: ``app.synth()`` fails when a finding is not
acknowledged, printing the report (also written to the cloud assembly as
``validation-report.json``). A finding is accepted with
``Validations.of(construct).acknowledge(id=..., reason=...)`` on the construct it concerns (and
its children), never stack-wide, so a new resource of another kind is checked again.
"""

from __future__ import annotations

from typing import Any, Protocol

from aws_cdk import Acknowledgment, App, Names, Stack, Validations
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_secretsmanager as secretsmanager
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct, Node

from stacks import constants
from stacks.analytics import AnalyticsConstruct
from stacks.broker import BrokerConstruct
from stacks.data import DataConstruct
from stacks.functions import FunctionsConstruct
from stacks.monitoring import MonitoringConstruct
from stacks.names import broker_users_secret_prefix
from stacks.pool_stacks import pool_stacks
from stacks.workers import WorkersConstruct

PACK = "AwsSolutions"

LAMBDA_MANAGED_POLICIES = (
    "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
    "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole",
)
REASONS = {
    "IAM4": (
        "Lambda's own managed policies: CloudWatch Logs writes and the ENI management a function in a "
        "VPC needs (ec2:CreateNetworkInterface and friends support no resource-level permissions)."
    ),
    "IAM5[Resource::*]": (
        "Only actions without resource-level permissions: X-Ray PutTraceSegments/"
        "PutTelemetryRecords, and the EC2 Describe*/network-interface actions that an event "
        "source mapping's pollers need. Every data-service action names its resource."
    ),
    "L1": (
        "Python 3.13 (stacks/platform.py), not 3.14: the layer's handlers are import-tested from the layer "
        "in the runtime's interpreter before every deploy, and no 3.14 interpreter installs on this "
        "project's machines (none in Debian 12 or from PyPI); docs/deployment.md, 'Runtime and platform'."
    ),
}


class AwsTarget(Protocol):
    """What the AWS target's findings concern (``SwitchyardStack`` has it): nag imports no stack
    module, so the constructs inside the stack (the bus, the pending queue) can accept their own."""

    broker: BrokerConstruct | None  # None, and the others below: the part is not deployed
    data: DataConstruct
    functions: FunctionsConstruct
    workers: WorkersConstruct | None
    analytics: AnalyticsConstruct | None

    @property
    def node(self) -> Node: ...

    def get_logical_id(self, element: Any) -> str: ...


class LocalStackTarget(Protocol):
    """What the ``localstack`` target's findings concern (``LocalStackTargetStack`` has it)."""

    broker_secret: secretsmanager.ISecret
    bucket: s3.IBucket
    monitoring: MonitoringConstruct


def rule(rule_id: str) -> str:
    """The acknowledgement id of an AwsSolutions rule, e.g. ``rule("SMG4")``."""
    return f"{PACK}::{PACK}-{rule_id}"


def accept(construct: IConstruct, rule_id: str, reason: str) -> None:
    """Accept the finding ``rule_id`` on ``construct`` and its children only, for ``reason``."""
    Validations.of(construct).acknowledge(Acknowledgment(id=rule(rule_id), reason=reason))


def logical_id(construct: IConstruct) -> str:
    """``construct``'s resource's logical ID in its own template (the parent's, or a pool's nested one)."""
    resource = construct.node.default_child
    return Stack.of(resource).get_logical_id(resource)  # type: ignore[arg-type]


def ref_from(scope: IConstruct, target: IConstruct) -> str:
    """How a ``Ref`` of ``target``'s resource reads in ``scope``'s template: its logical ID, or in a
    pool's nested stack the parameter CDK passes it as."""
    resource = target.node.default_child
    assert resource is not None
    if Stack.of(resource) is Stack.of(scope):
        return logical_id(target)
    return f"referenceto{Names.node_unique_id(resource.node)}Ref"


def apply_checks(app: App) -> None:
    """Run AwsSolutionsChecks over the whole app at synth time."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))


def acknowledge(stack: AwsTarget) -> None:
    """Accepted findings of ``stack``, each with its reason."""
    broker_secrets = (stack.broker.secret, *stack.broker.users.values()) if stack.broker else ()
    for secret in broker_secrets:
        accept(
            secret,
            "SMG4",
            "Amazon MQ has no managed rotation for broker users: rotating this password needs a custom "
            "rotation Lambda that also updates the broker user (the pools custom resource sets the role "
            "users' passwords from their secrets at each deploy), which is not built yet. The secret is "
            "only usable from inside the VPC (the broker is not publicly accessible).",
        )
    _data(stack)
    _functions(stack)
    if stack.workers is not None:
        _workers(stack.workers)
    if stack.analytics is not None:
        _analytics(stack, stack.analytics)


def _data(stack: AwsTarget) -> None:
    data = stack.data
    if data.config.has(constants.PART_DELAY):
        _postgres(data)
    if data.config.redis_needed:
        _redis(data)
    _helpers(stack)


def _postgres(data: DataConstruct) -> None:
    accept(
        data.postgres,
        "SMG4",
        "Rotation would change the password under warm Lambda environments, which read the secret once "
        "per process; rotate by redeploying (or add single-user rotation with a reconnect-on-auth-failure "
        "in the store first).",
    )
    accept(
        data.postgres,
        "RDS3",
        "Multi-AZ doubles the instance cost; it is one context switch away (switchyard:postgres multiAz). "
        "The delay store survives a single-AZ outage late, not lost: Kafka keeps unconsumed input.",
    )
    accept(
        data.postgres,
        "RDS10",
        "Deletion protection is off by default so `cdk destroy` tears the stack down (a final snapshot "
        "is still taken: RemovalPolicy.SNAPSHOT); production sets switchyard:postgres deletionProtection.",
    )
    accept(
        data.postgres,
        "RDS11",
        "The port is not a secret: the instance is in isolated subnets and its security group admits "
        "5432 only from the functions' group.",
    )


def _redis(data: DataConstruct) -> None:
    accept(
        data.redis_secret,
        "SMG4",
        "ElastiCache AUTH tokens rotate with ModifyReplicationGroup (ROTATE then SET), which no managed "
        "rotation function does; the token is reachable only from the functions' security group.",
    )
    accept(
        data.redis,
        "AEC4",
        "One node by default (pool state can be rebuilt from the broker and ECS by the reconciler); "
        "switchyard:redis replicas >= 1 turns on Multi-AZ with automatic failover.",
    )


def _helpers(stack: AwsTarget) -> None:
    for child in stack.node.children:  # CDK's LogRetention singleton: RDS's exported log group
        if child.node.id.startswith("LogRetention"):
            accept(child, f"IAM4[{LAMBDA_MANAGED_POLICIES[0]}]", REASONS["IAM4"])
            accept(
                child,
                "IAM5[Resource::*]",
                "CDK's LogRetention function sets retention on log groups RDS creates itself, whose "
                "names it cannot know before the instance exists.",
            )
    bootstrap = stack.node.try_find_child("AWS679f53fac002430cb0da5b7982bd2287")
    if bootstrap is not None:  # AwsCustomResource's singleton (reads MSK's IAM bootstrap string)
        accept(bootstrap, f"IAM4[{LAMBDA_MANAGED_POLICIES[0]}]", REASONS["IAM4"])
        accept(bootstrap, "L1", "CDK's AwsCustomResource singleton picks its own Node.js runtime.")


def _functions(stack: AwsTarget) -> None:
    if stack.functions.delay:
        accept(stack.functions.kafka_failures, "SQS3", "It is the dead-letter destination itself: the MSK "
               "mappings send it the batches that exhausted their retries, and an alarm watches its depth.")
    for fn in stack.functions.functions.values():
        for policy in LAMBDA_MANAGED_POLICIES:
            accept(fn, f"IAM4[{policy}]", REASONS["IAM4"])
        accept(fn, "IAM5[Resource::*]", REASONS["IAM5[Resource::*]"])
        accept(fn, "L1", REASONS["L1"])
        # Invoking a function's versions (ARN:*) is how the Provider framework and the schedules call it.
        accept(
            fn,
            f"IAM5[Resource::<{logical_id(fn)}.Arn>:*]",
            "Invocation of the function's own versions and aliases only.",
        )
    for provider in stack.functions.providers:
        accept(provider, f"IAM4[{LAMBDA_MANAGED_POLICIES[0]}]", REASONS["IAM4"])
        target = provider.on_event_handler.node.default_child
        accept(
            provider,
            f"IAM5[Resource::<{Stack.of(target).get_logical_id(target)}.Arn>:*]",  # type: ignore[arg-type]
            "The Provider framework invokes its one handler function (any version).",
        )
    for child in (child for s in (stack, *pool_stacks(stack)) for child in s.node.children):  # type: ignore[arg-type]
        if child.node.id.startswith("SchedulerRoleForTarget"):
            for fn in stack.functions.functions.values():
                accept(
                    child,
                    f"IAM5[Resource::<{logical_id(fn)}.Arn>:*]",
                    "EventBridge Scheduler's role invokes its one target function (any version).",
                )
    ecs_reason = (
        "The ECS driver runs tasks of the pool's task definition family (any revision), and "
        "lists/describes/stops/tags tasks of the one worker cluster (task ids are not known "
        "before RunTask); every statement is conditioned on that cluster."
    )
    for name in stack.functions.pools:
        workers = stack.functions.workers
        for fn in (stack.functions.pools[name].orphans, stack.functions.pools[name].reconcile):
            cluster = ref_from(fn, workers.cluster)
            for resource in (
                f"container-instance/<{cluster}>/*",
                f"task-definition/{workers.task_definitions[name].family}:*",
                f"task/<{cluster}>/*",
            ):
                accept(
                    fn,
                    f"IAM5[Resource::arn:<AWS::Partition>:ecs:<AWS::Region>:<AWS::AccountId>:{resource}]",
                    ecs_reason,
                )
    teardown = stack.functions.functions.get("DeployPools")
    if teardown is not None:
        cluster = stack.get_logical_id(stack.functions.workers.cluster.node.default_child)
        for resource in (f"container-instance/<{cluster}>/*", f"task/<{cluster}>/*"):
            rule = f"IAM5[Resource::arn:<AWS::Partition>:ecs:<AWS::Region>:<AWS::AccountId>:{resource}]"
            accept(teardown, rule,
                   "On Delete the pools resource stops every worker task of the one cluster (their ids are "
                   "not known to CloudFormation); each statement is conditioned on that cluster.")
        users = f"{broker_users_secret_prefix(teardown)}*"
        accept(teardown, f"IAM5[Resource::arn:<AWS::Partition>:secretsmanager:<AWS::Region>:<AWS::AccountId>:"
               f"secret:{users}]",
               "The pools resource sets every broker role user's password from its secret: the secrets "
               "named under the stack's own prefix (a stack name has no '/'), one statement for any pools.")


def _workers(workers: WorkersConstruct) -> None:
    for task in workers.task_definitions.values():
        accept(
            task,
            "ECS2",
            "Only non-secret settings are environment variables (the broker URL with placeholders, log "
            "level, pool); the AMQP credentials are ECS secrets from Secrets Manager.",
        )
        accept(
            task,
            "IAM5[Resource::*]",
            "ecr:GetAuthorizationToken has no resource-level permissions (image pulls themselves are "
            "scoped to the asset repository).",
        )


def _analytics(stack: AwsTarget, analytics: AnalyticsConstruct) -> None:
    accept(
        analytics.bucket,
        "S1",
        "A server-access-log bucket would need its own access logs; access is already audited by "
        "CloudTrail data events when the account enables them, and the bucket is private, TLS-only.",
    )
    for action in ("s3:Abort*", "s3:DeleteObject*", "s3:GetBucket*", "s3:GetObject*", "s3:List*"):
        accept(
            analytics.job_role,
            f"IAM5[Action::{action}]",
            "CDK's grantReadWrite on the pipeline's own bucket: object-level verbs of that one bucket.",
        )
    logical = stack.get_logical_id(analytics.bucket.node.default_child)
    accept(
        analytics.job_role,
        f"IAM5[Resource::<{logical}.Arn>/*]",
        "Every object of the pipeline's own bucket (job code, inputs, outputs, logs).",
    )


def acknowledge_localstack(stack: LocalStackTarget) -> None:
    """Accepted findings of the ``localstack`` target's stack, each with its reason."""
    accept(stack.broker_secret, "SMG4", "The local RabbitMQ's guest user, a fixed development credential "
           "of a broker that listens on 127.0.0.1 only; there is nothing to rotate.")
    accept(stack.bucket, "S1", "A LocalStack bucket on the developer's machine: no access log to audit.")
    accept(stack.monitoring.topic, "SNS2", "LocalStack 4.13 on Python 3.11 cannot create the symmetric KMS "
           "key (its KMS passes bytes to uuid.uuid5); the topic carries only alarm notifications locally.")
