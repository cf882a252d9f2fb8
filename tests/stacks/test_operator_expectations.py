"""What an operator expects of the deployed stack, on the template: alarms on the resources that fill
up (broker memory and disk, RDS storage, MSK disk), heartbeats for the loops that must always run, a
retention on every log group anything writes to, the public APIs' functions apart from the data
services' clients, a bound on what unauthenticated requests can cost, and the versioned EMR bucket's
old versions expiring."""

from __future__ import annotations

from typing import Any

import pytest

from tests.iam_policy import references
from tests.stacks.test_iam_per_role import _of_kind

LOOPS = ("delay_fire", "delay_sweep", "rpc_reconcile")  # scheduled every minute: silence is an outage
PUBLIC_APIS = ("bus_api", "pending_api")


def _metrics(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    props = alarm["Properties"]
    if "MetricName" in props:
        return [{"MetricName": props["MetricName"], "Namespace": props.get("Namespace"),
                 "Dimensions": props.get("Dimensions", [])}]
    return [m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]


def _alarmed(resources: dict[str, Any], namespace: str, metric: str) -> list[dict[str, Any]]:
    return [a["Properties"] for a in _of_kind(resources, "AWS::CloudWatch::Alarm").values()
            if any(m["Namespace"] == namespace and m["MetricName"] == metric for m in _metrics(a))]


def _functions(resources: dict[str, Any], modules: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in _of_kind(resources, "AWS::Lambda::Function").items()
            if v["Properties"].get("Handler", "").split(".")[0] in modules}


@pytest.mark.parametrize(("namespace", "metric"), [
    ("AWS/AmazonMQ", "RabbitMQMemUsed"), ("AWS/AmazonMQ", "RabbitMQDiskFree"),
    ("AWS/RDS", "FreeStorageSpace"), ("AWS/Kafka", "KafkaDataLogsDiskUsed")])
def test_what_fills_up_is_alarmed(resources: dict[str, Any], namespace: str, metric: str) -> None:
    assert _alarmed(resources, namespace, metric), f"no alarm on {namespace} {metric}"


def test_rds_storage_grows_by_itself(resources: dict[str, Any]) -> None:
    ((_, db),) = _of_kind(resources, "AWS::RDS::DBInstance").items()
    props = db["Properties"]
    assert int(props.get("MaxAllocatedStorage", 0)) > int(props["AllocatedStorage"]), props


def test_the_loops_have_heartbeats_that_missing_data_trips(resources: dict[str, Any]) -> None:
    beats = _alarmed(resources, "AWS/Lambda", "Invocations")
    for fn in _functions(resources, LOOPS):
        mine = [a for a in beats if fn in references(a.get("Metrics", a.get("Dimensions")))]
        assert [a["TreatMissingData"] for a in mine] == ["breaching"], (fn, mine)


def test_every_log_group_written_to_has_a_retention(resources: dict[str, Any]) -> None:
    groups = _of_kind(resources, "AWS::Logs::LogGroup")
    assert [k for k, g in groups.items() if "RetentionInDays" not in g["Properties"]] == []
    retained = [r["Properties"]["LogGroupName"] for r in _of_kind(resources, "Custom::LogRetention").values()]
    named = [*(g["Properties"].get("LogGroupName") for g in groups.values()), *retained]
    missing = []
    for logical, fn in _of_kind(resources, "AWS::Lambda::Function").items():
        config = fn["Properties"].get("LoggingConfig", {}).get("LogGroup")
        if not (config and set(references(config)) & set(groups)) and \
                not any(logical in references(n) for n in named if n):
            missing.append(f"function {logical}")
    for logical, stage in _of_kind(resources, "AWS::ApiGateway::Stage").items():
        api = stage["Properties"]["RestApiId"]["Ref"]
        if not any(api in references(n) and "API-Gateway-Execution-Logs" in str(n) for n in named if n):
            missing.append(f"stage {logical}'s execution logs")
    for logical in _of_kind(resources, "AWS::AmazonMQ::Broker"):
        if not any(logical in references(n) and "amazonmq" in str(n) for n in named if n):
            missing.append(f"broker {logical}'s general log")
    assert missing == []


def test_the_public_api_functions_are_not_data_service_clients(resources: dict[str, Any]) -> None:
    def groups(fn: dict[str, Any]) -> set[str]:
        return {r for r in references(fn["Properties"].get("VpcConfig", {}).get("SecurityGroupIds", []))}

    apis = _functions(resources, PUBLIC_APIS)
    assert len(apis) == 2
    admitted = {}  # security group -> the groups it admits
    for rule in _of_kind(resources, "AWS::EC2::SecurityGroupIngress").values():
        props = rule["Properties"]
        for target in references(props["GroupId"]):
            admitted.setdefault(target, set()).update(references(props.get("SourceSecurityGroupId", {})))
    data_services = [k for k in admitted if any(w in k for w in ("Postgres", "Msk", "Broker"))]
    assert data_services
    for logical, fn in apis.items():
        for service in data_services:
            assert not groups(fn) & admitted[service], f"{logical} may reach {service}"


def test_unauthenticated_requests_are_bounded(resources: dict[str, Any]) -> None:
    for logical, fn in _functions(resources, PUBLIC_APIS).items():
        assert fn["Properties"].get("ReservedConcurrentExecutions"), f"{logical} reserves no concurrency"
    stages = _of_kind(resources, "AWS::ApiGateway::Stage").values()
    assert len(stages) == 2
    for stage in stages:
        (settings,) = stage["Properties"]["MethodSettings"]
        assert settings["ThrottlingRateLimit"] > 0 and settings["ThrottlingBurstLimit"] > 0


def test_the_versioned_retained_buckets_expire_old_versions(resources: dict[str, Any]) -> None:
    for logical, bucket in _of_kind(resources, "AWS::S3::Bucket").items():
        props = bucket["Properties"]
        if props.get("VersioningConfiguration", {}).get("Status") != "Enabled":
            continue
        rules = props.get("LifecycleConfiguration", {}).get("Rules", [])
        assert any("NoncurrentVersionExpiration" in r for r in rules), f"{logical} keeps every version"
        assert any("AbortIncompleteMultipartUpload" in r for r in rules), f"{logical} keeps failed uploads"
