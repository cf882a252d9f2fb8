"""The pending queue's AWS resources (stacks/pending.py) in the synthesized template."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Match, Template

from stacks import constants
from stacks.constants import STACK_ID
from stacks.pending import API_TIMEOUT_S
from switchyard.pending.metrics import PENDING_DATA_LOSS_EVENTS


def _of_type(resources: dict[str, dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in resources.items() if v["Type"] == kind}


def test_the_node_api_function_fits_api_gateway(template: Template,
                                                resources: dict[str, dict[str, Any]]) -> None:
    functions = [r["Properties"] for r in _of_type(resources, "AWS::Lambda::Function").values()
                 if r["Properties"].get("Handler") == "pending_api.lambda_handler"]
    assert len(functions) == 1
    fn = functions[0]
    assert fn["Timeout"] == API_TIMEOUT_S <= 29
    env = fn["Environment"]["Variables"]
    assert {"SWITCHYARD_REDIS_URL", "SWITCHYARD_REDIS_SECRET_ARN", "SWITCHYARD_PENDING_TOKENS_SECRET_ARN",
            "SWITCHYARD_PENDING_STORE"} <= set(env)
    assert fn["TracingConfig"] == {"Mode": "Active"} and "VpcConfig" in fn
    # one tenant's idle long polls cannot take the account's concurrency (issue 23 item 9)
    assert fn["ReservedConcurrentExecutions"] == constants.PENDING_API_RESERVED_CONCURRENCY == 100
    assert int(env["SWITCHYARD_PENDING_RETRY_WINDOW_S"]) < API_TIMEOUT_S
    template.has_resource_properties("AWS::ApiGateway::Method", {
        "HttpMethod": "ANY",
        "Integration": Match.object_like({"Type": "AWS_PROXY", "TimeoutInMillis": API_TIMEOUT_S * 1000}),
    })
    template.has_resource_properties("AWS::ApiGateway::Stage", {
        "StageName": "v1", "TracingEnabled": True,
        "MethodSettings": Match.array_with([Match.object_like({"ThrottlingRateLimit": Match.any_value()})]),
        "AccessLogSetting": Match.object_like({"DestinationArn": Match.any_value()}),
    })


def test_tokens_secret_is_read_by_the_function_only(resources: dict[str, dict[str, Any]]) -> None:
    secrets = {k for k, v in _of_type(resources, "AWS::SecretsManager::Secret").items()
               if "bearer tokens" in v["Properties"].get("Description", "")}
    assert len(secrets) == 1
    token_secret = secrets.pop()
    def names_secret(statement: dict[str, Any]) -> bool:
        targets = statement.get("Resource")
        return {"Ref": token_secret} in (targets if isinstance(targets, list) else [targets])

    readers = [r for r in _of_type(resources, "AWS::IAM::Policy").values()
               if any(names_secret(s) for s in r["Properties"]["PolicyDocument"]["Statement"])]
    assert len(readers) == 1


def test_streams_bucket_is_private_and_expires(template: Template) -> None:
    template.has_resource_properties("AWS::S3::Bucket", {
        "PublicAccessBlockConfiguration": Match.object_like({"BlockPublicAcls": True}),
        "LifecycleConfiguration": {"Rules": Match.array_with([Match.object_like({"ExpirationInDays": 1})])},
    })


def test_pending_alarms_notify_the_alarm_topic(resources: dict[str, dict[str, Any]]) -> None:
    alarms = {r["Properties"]["AlarmName"].removeprefix(f"{STACK_ID}-"): r["Properties"]
              for r in _of_type(resources, "AWS::CloudWatch::Alarm").values()}
    for name in ("pending-pickup-timeouts", "pending-abandoned-responses", "pending-processors-lost",
                 "pending-data-loss", "pending-api-errors-or-throttles"):
        alarm = alarms[name]
        assert alarm["AlarmActions"], name
        assert alarm["AlarmDescription"]
    query = alarms["pending-data-loss"]["Metrics"][0]["Expression"]
    assert PENDING_DATA_LOSS_EVENTS in query and "Endpoint" in query
