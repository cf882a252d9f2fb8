"""IAM grants the stack's roles share: secrets, MSK (IAM auth), event source pollers, a pool's ECS tasks.

Each grant names its resource; the few actions that support no resource-level permission (EC2's
network-interface actions) are said so where they are granted.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Fn, Stack
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_secretsmanager as secretsmanager

from stacks.config import PoolConfig
from stacks.parameters import DELAY_CONSUMER_GROUP
from switchyard.rpc.drivers.ecs import TAG_POOL


def read_secrets(fn: lambda_.Function, *secrets: secretsmanager.ISecret) -> None:
    """Let ``fn`` read each of ``secrets`` (and nothing else of Secrets Manager)."""
    for secret in secrets:
        fn.add_to_role_policy(
            iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"], resources=[secret.secret_arn])
        )


def read_secrets_named(fn: lambda_.Function, prefix: str) -> None:
    """Let ``fn`` read every secret whose name starts with ``prefix``: one statement, however many."""
    arn = Stack.of(fn).format_arn(service="secretsmanager", resource="secret", resource_name=f"{prefix}*",
                                  arn_format=ArnFormat.COLON_RESOURCE_NAME)
    fn.add_to_role_policy(iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"], resources=[arn]))


def kafka_arn(cluster_arn: str, kind: str, name: str) -> str:
    """``arn:...:{kind}/{cluster}/{uuid}/{name}`` from the cluster ARN (IAM resources of MSK)."""
    head, tail = (Fn.select(i, Fn.split(":cluster/", cluster_arn)) for i in (0, 1))
    return Fn.join("", [head, f":{kind}/", tail, f"/{name}"])


def kafka_access(
    grantee: iam.IGrantable,
    cluster_arn: str,
    *,
    write: tuple[str, ...] = (),
    read: tuple[str, ...] = (),
    create: tuple[str, ...] = (),
    group: str = DELAY_CONSUMER_GROUP,
) -> None:
    """IAM for MSK (IAM auth): write (idempotently), read as ``group``, create topics."""

    def allow(actions: list[str], resources: list[str]) -> None:
        statement = iam.PolicyStatement(actions=actions, resources=resources)
        grantee.grant_principal.add_to_principal_policy(statement)

    def topics(names: tuple[str, ...]) -> list[str]:
        return [kafka_arn(cluster_arn, "topic", t) for t in names]

    allow(["kafka-cluster:Connect"], [cluster_arn])
    if write:
        allow(["kafka-cluster:DescribeTopic", "kafka-cluster:WriteData"], topics(write))
        # The idempotent producer needs a transactional-id-free idempotent write grant.
        allow(["kafka-cluster:WriteDataIdempotently"], [cluster_arn])
    if read:
        allow(["kafka-cluster:DescribeTopic", "kafka-cluster:ReadData"], topics(read))
        allow(["kafka-cluster:DescribeGroup", "kafka-cluster:AlterGroup"],
              [kafka_arn(cluster_arn, "group", group)])
        allow(["kafka:DescribeClusterV2", "kafka:GetBootstrapBrokers",
               "kafka-cluster:DescribeClusterDynamicConfiguration"], [cluster_arn])
    if create:
        allow(["kafka-cluster:CreateTopic", "kafka-cluster:DescribeTopic", "kafka-cluster:AlterTopic"],
              topics(create))


def event_source_network_access(fn: lambda_.Function) -> None:
    """What an event source mapping's pollers do with the execution role: ENIs in the VPC.

    EC2's Describe* and network-interface actions support no resource-level permissions.
    """
    fn.add_to_role_policy(
        iam.PolicyStatement(
            actions=[
                "ec2:CreateNetworkInterface",
                "ec2:DeleteNetworkInterface",
                "ec2:DescribeNetworkInterfaces",
                "ec2:DescribeSecurityGroups",
                "ec2:DescribeSubnets",
                "ec2:DescribeVpcs",
            ],
            resources=["*"],
        )
    )


def ecs_stop_access(fn: lambda_.Function, cluster: ecs.ICluster) -> None:
    """List, describe and stop the worker tasks of ``cluster`` (the teardown on ``cdk destroy``)."""
    stack = Stack.of(fn)
    on_cluster = {"ArnEquals": {"ecs:cluster": cluster.cluster_arn}}
    for actions, kind in ((["ecs:StopTask", "ecs:DescribeTasks"], "task"),
                          (["ecs:ListTasks"], "container-instance")):
        arn = stack.format_arn(service="ecs", resource=kind, resource_name=f"{cluster.cluster_name}/*")
        fn.add_to_role_policy(iam.PolicyStatement(actions=actions, resources=[arn], conditions=on_cluster))


def ecs_pool_access(
    fn: lambda_.Function, *, cluster: ecs.ICluster, task: ecs.TaskDefinition, family: str,
    spares_of: PoolConfig | None = None,
) -> None:
    """Run, tag, list, describe and stop a pool's worker tasks (``family``) in the one cluster; pass
    their roles. ``spares_of``: the pool; with ``minSpares`` a group's start tags the running spare
    task it adopts with the group and key (only tasks tagged with that pool)."""
    stack = Stack.of(fn)
    family_arn = stack.format_arn(service="ecs", resource="task-definition", resource_name=f"{family}:*")
    task_arns = stack.format_arn(service="ecs", resource="task", resource_name=f"{cluster.cluster_name}/*")
    on_cluster = {"ArnEquals": {"ecs:cluster": cluster.cluster_arn}}
    fn.add_to_role_policy(
        iam.PolicyStatement(actions=["ecs:RunTask"], resources=[family_arn], conditions=on_cluster)
    )
    ecs_stop_access(fn, cluster)
    fn.add_to_role_policy(
        iam.PolicyStatement(
            actions=["ecs:TagResource"],
            resources=[task_arns],
            conditions={"StringEquals": {"ecs:CreateAction": "RunTask"}},
        )
    )
    if spares_of is not None and spares_of.min_spares:
        fn.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecs:TagResource"],
                resources=[task_arns],
                conditions={"StringEquals": {f"aws:ResourceTag/{TAG_POOL}": spares_of.name}},
            )
        )
    roles = [task.task_role.role_arn]
    if task.execution_role is not None:
        roles.append(task.execution_role.role_arn)
    fn.add_to_role_policy(
        iam.PolicyStatement(
            actions=["iam:PassRole"],
            resources=roles,
            conditions={"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}},
        )
    )
