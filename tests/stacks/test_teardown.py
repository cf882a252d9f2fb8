"""``cdk destroy`` with worker groups running: the pools custom resource's Delete stops the tasks the
control plane started with RunTask (CloudFormation knows nothing of them, and ECS refuses to delete a
cluster that still runs tasks), against moto's ECS, with the calls it makes judged by the pools
function's role in the template (tests/iam_policy.py); and the template orders the teardown."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from switchyard.aws import deploy
from tests.conftest import unique
from tests.iam_policy import REGION, Resolver, denied, recording, references, role_statements
from tests.rpc.test_ecs_driver import network  # noqa: F401  (a fixture: moto's subnet and group)
from tests.stacks.test_iam_per_role import MOTO, _of_kind, _role_of


def _pools_resource(resources: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ((logical, resource),) = _of_kind(resources, "Custom::SwitchyardPools").items()
    return logical, resource


def _depends_on(resources: dict[str, Any], logical: str) -> set[str]:
    """The resources ``logical`` is created after (and so deleted before)."""
    resource = resources[logical]
    return set(resource.get("DependsOn", [])) | set(references(resource.get("Properties")))


def test_the_template_stops_the_workers_after_their_starters_and_before_the_cluster(
        resources: dict[str, Any]) -> None:
    logical, _ = _pools_resource(resources)
    after = _depends_on(resources, logical)
    for kind in ("AWS::ECS::Cluster", "AWS::ECS::ClusterCapacityProviderAssociations"):
        assert set(_of_kind(resources, kind)) <= after, f"the pools resource is not deleted before its {kind}"
    starters = [*(k for k in _of_kind(resources, "AWS::Scheduler::Schedule") if "reconcile" in k),
                *(k for k in _of_kind(resources, "AWS::Lambda::EventSourceMapping")
                  if "orphans" in k.lower())]
    assert starters
    assert [s for s in starters if logical not in _depends_on(resources, s)] == []


@pytest.fixture
def ecs() -> Any:
    return boto3.client("ecs", endpoint_url=MOTO, region_name=REGION)


def _run(ecs: Any, cluster: str, family: str, count: int, subnet_and_group: tuple[str, str]) -> list[str]:
    ecs.register_task_definition(family=family, requiresCompatibilities=["FARGATE"], networkMode="awsvpc",
                                 cpu="256", memory="512",
                                 containerDefinitions=[{"name": "worker", "image": "w:1", "memory": 512}])
    subnet, group = subnet_and_group
    vpc = {"awsvpcConfiguration": {"subnets": [subnet], "securityGroups": [group]}}
    return [t["taskArn"] for t in ecs.run_task(cluster=cluster, taskDefinition=family, count=count,
                                               launchType="FARGATE", networkConfiguration=vpc)["tasks"]]


def test_delete_stops_the_pools_tasks_and_waits_for_them(resources: dict[str, Any], ecs: Any,
                                                         network: tuple[str, str]) -> None:  # noqa: F811
    _, resource = _pools_resource(resources)
    template_cluster = resource["Properties"].get("Cluster", {"Ref": "missing"})
    (cluster_logical,) = _of_kind(resources, "AWS::ECS::Cluster")
    cluster = unique("teardown")
    resolver = Resolver(resources, refs={cluster_logical: cluster})
    props = resolver.value(resource["Properties"])
    ecs.create_cluster(clusterName=cluster)
    families = props.get("Families", [])
    assert families, "the pools resource names no worker families: its Delete cannot find their tasks"
    workers = [arn for family in families for arn in _run(ecs, cluster, family, 2, network)]
    other = _run(ecs, cluster, unique("not_a_worker"), 1, network)

    requests: list[dict[str, Any]] = []
    with recording(requests):
        boto3.setup_default_session()  # a session made inside the block: it records
        deploy.declare_pools({"RequestType": "Delete", "PhysicalResourceId": "switchyard-pools",
                              "ResourceProperties": {**props, "Cluster": resolver.value(template_cluster)}})

    described = {t["taskArn"]: t for t in ecs.describe_tasks(cluster=cluster, tasks=workers + other)["tasks"]}
    assert [arn for arn in workers if described[arn]["lastStatus"] != "STOPPED"] == []
    # not a worker of the pools: left alone (moto moves every task it describes a step along its
    # lifecycle, so the status wanted, not the last one, says who stopped it)
    assert described[other[0]]["desiredStatus"] == "RUNNING"
    fn = next(k for k, v in _of_kind(resources, "AWS::Lambda::Function").items()
              if v["Properties"]["Handler"] == "deploy_pools.on_event")
    statements = role_statements(resources, _role_of(resources[fn]["Properties"]["Role"]), resolver)
    assert {r["operation"] for r in requests} >= {"ListTasks", "StopTask", "DescribeTasks"}
    assert denied(statements, requests) == []


def test_tasks_that_do_not_stop_fail_the_delete_with_their_names() -> None:
    from switchyard.aws.teardown import stop_worker_tasks
    from switchyard.core.errors import ConfigError

    class Stuck:  # ECS accepting StopTask while the task never reaches STOPPED
        def get_paginator(self, _: str) -> Any:
            return type("P", (), {"paginate": lambda *_a, **_k: [{"taskArns": ["arn:task/1"]}]})()

        def stop_task(self, **_: Any) -> None:
            pass

        def describe_tasks(self, **_: Any) -> dict[str, Any]:
            return {"tasks": [{"taskArn": "arn:task/1", "lastStatus": "DEACTIVATING"}]}

    ticks = iter(range(100))
    stuck = r"1 worker tasks of cluster c did not stop within 3 s .*arn:task/1"
    with pytest.raises(ConfigError, match=stuck):
        stop_worker_tasks(Stuck(), "c", ["f"], timeout_s=3, poll_s=0, clock=lambda: float(next(ticks)))


# One per account and region, whatever stack made it: two stacks would overwrite each other's, and
# destroying one would break the other (API Gateway's CloudWatch Logs role).
ACCOUNT_SINGLETONS = ("AWS::ApiGateway::Account",)


def test_no_resource_is_shared_by_two_stacks_in_one_account(two_stacks: list[Any]) -> None:
    from aws_cdk.assertions import Template

    for stack in two_stacks:
        resources = Template.from_stack(stack).to_json()["Resources"]
        shared = [f"{stack.stack_name}: {k} ({v['Type']})" for k, v in resources.items()
                  if v["Type"] in ACCOUNT_SINGLETONS]
        assert shared == []
