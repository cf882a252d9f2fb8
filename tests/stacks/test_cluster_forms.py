"""The cluster forms the stack offers, synthesized once together (``cluster_forms`` in conftest.py):
Amazon MQ's ``CLUSTER_MULTI_AZ`` broker and ElastiCache in cluster mode (2 shards x 1 replica), each
checked against the default single-node form, which must stay as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template

from stacks import constants
from stacks.config import DeploymentConfig, RedisConfig
from stacks.data import DataConstruct
from stacks.network import NetworkConstruct
from stacks.resource_alarms import redis_memory
from switchyard.core.config import REDIS_CLUSTER_ENV, REDIS_URL_ENV

pytestmark = pytest.mark.slow

Resources = dict[str, dict[str, Any]]


def of_type(resources: Resources, kind: str) -> list[dict[str, Any]]:
    return [r["Properties"] for r in resources.values() if r["Type"] == kind]


def settings_of_redis_users(resources: Resources) -> list[dict[str, Any]]:
    """The settings of everything that is told where Redis is: each function's environment, each
    container's, and the deployed configuration (the SSM parameters, by variable name)."""
    found = [fn.get("Environment", {}).get("Variables", {})
             for fn in of_type(resources, "AWS::Lambda::Function")]
    found += [{v["Name"]: v["Value"] for v in container.get("Environment", [])}
              for task in of_type(resources, "AWS::ECS::TaskDefinition")
              for container in task["ContainerDefinitions"]]
    parameters = of_type(resources, "AWS::SSM::Parameter")
    found.append({p["Name"].rpartition("/")[2]: p["Value"] for p in parameters})
    return [env for env in found if REDIS_URL_ENV in env]


@pytest.fixture(scope="module")
def clustered(cluster_forms: tuple[Template, Path, Any]) -> Resources:
    return cluster_forms[0].to_json()["Resources"]


def test_cluster_mode_shards_the_group_with_a_replica_each_on_the_cluster_parameter_group(
        clustered: Resources, resources: Resources) -> None:
    (group,) = of_type(clustered, "AWS::ElastiCache::ReplicationGroup")
    assert (group["ClusterMode"], group["NumNodeGroups"], group["ReplicasPerNodeGroup"]) == ("enabled", 2, 1)
    assert group["CacheParameterGroupName"] == "default.valkey8.cluster.on"
    assert group["AutomaticFailoverEnabled"] is True and group["MultiAZEnabled"] is True
    assert "NumCacheClusters" not in group
    (single,) = of_type(resources, "AWS::ElastiCache::ReplicationGroup")  # off: one node, as before
    assert single["NumCacheClusters"] == 1 and single["AutomaticFailoverEnabled"] is False
    assert not {"ClusterMode", "NumNodeGroups", "ReplicasPerNodeGroup", "CacheParameterGroupName"} & {*single}


@pytest.mark.parametrize(("form", "endpoint", "cluster"), [
    ("clustered", "ConfigurationEndPoint.Address", "1"),
    ("resources", "PrimaryEndPoint.Address", None),
])
def test_every_redis_user_reaches_the_form_s_endpoint_with_the_cluster_switch_only_on_a_cluster(
        form: str, endpoint: str, cluster: str | None, request: pytest.FixtureRequest) -> None:
    users = settings_of_redis_users(request.getfixturevalue(form))
    # 7 functions (the pool's orphans, dead letters, activity and reconcile; the bus API and housekeeping;
    # the pending API), the bus workers' task and the deployed configuration
    assert len(users) == 9
    for env in users:
        assert endpoint in json.dumps(env[REDIS_URL_ENV]), env[REDIS_URL_ENV]
        assert env.get(REDIS_CLUSTER_ENV) == cluster, sorted(env)


def test_the_memory_alarm_watches_the_fullest_shard(clustered: Resources) -> None:
    (alarm,) = [a for a in of_type(clustered, "AWS::CloudWatch::Alarm")
                if a["AlarmName"] == f"{constants.STACK_ID}-elasticache-memory"]
    expression = next(m["Expression"] for m in alarm["Metrics"] if "Expression" in m)
    members = [d["Value"] for m in alarm["Metrics"] if "MetricStat" in m
               for d in m["MetricStat"]["Metric"]["Dimensions"]]
    assert expression == "MAX([s1, s2])"
    assert [m.rpartition("-state-")[2] for m in members] == ["0001-001", "0002-001"]


def test_past_ten_shards_the_memory_alarm_is_one_per_ten_shards() -> None:
    """CloudWatch's alarm reads at most ten metrics: 12 shards take two alarms (no synth needed)."""
    stack = Stack(App())
    config = DeploymentConfig(pools=DeploymentConfig.from_context(stack).pools,
                              redis=RedisConfig(cluster_mode=True, shards=12, replicas=1))
    data = DataConstruct(stack, "Data", network=NetworkConstruct(stack, "Network"), config=config)
    found = redis_memory(data)
    assert [suffix for suffix, _ in found] == ["-shards-1-10", "-shards-11-12"]
    assert [len(metric.using_metrics) for _, metric in found] == [10, 2]  # type: ignore[attr-defined]


def test_the_broker_cluster_spans_the_availability_zones(clustered: Resources, resources: Resources) -> None:
    (broker,) = of_type(clustered, "AWS::AmazonMQ::Broker")
    assert (broker["DeploymentMode"], broker["EngineVersion"]) == ("CLUSTER_MULTI_AZ", "3.13")
    zones = [json.dumps(clustered[subnet["Ref"]]["Properties"]["AvailabilityZone"])
             for subnet in broker["SubnetIds"]]
    assert len(set(zones)) == len(zones) == constants.VPC_MAX_AZS  # its three nodes spread over every AZ
    (single,) = of_type(resources, "AWS::AmazonMQ::Broker")
    assert single["DeploymentMode"] == "SINGLE_INSTANCE" and len(single["SubnetIds"]) == 1


def test_cdk_nag_finds_nothing_unacknowledged_in_the_cluster_forms(
        cluster_forms: tuple[Template, Path, Any]) -> None:
    report = json.loads((cluster_forms[1] / "validation-report.json").read_text())
    (nag,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert nag["conclusion"] == "success" and nag["violations"] == []
