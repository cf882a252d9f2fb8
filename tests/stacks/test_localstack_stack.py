"""The ``localstack`` target's template (no AWS calls): only what LocalStack hosts, the configuration
parameters both targets write, and the alarms over Switchyard's own metrics, built by the same code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from stacks import constants
from stacks.application import build_app
from stacks.config import ConfigError
from switchyard.core.deployed_config import metrics_namespace
from switchyard.rpc.settings import CALL_TIMEOUT_ENV
from tests.stacks.test_switchyard_stack import actions_of, of_type, policy_statements, switchyard_functions

pytestmark = pytest.mark.slow

NOT_ON_LOCALSTACK = ("AWS::EC2::", "AWS::AmazonMQ::", "AWS::MSK::", "AWS::RDS::", "AWS::ElastiCache::",
                     "AWS::ECS::", "AWS::Lambda::", "AWS::EMRServerless::", "AWS::Scheduler::",
                     "AWS::ApiGateway::", "AWS::KMS::", "Custom::")


def _parameters(resources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {r["Properties"]["Name"]: r["Properties"]["Value"]
            for r in of_type(resources, "AWS::SSM::Parameter").values()}


def test_only_what_localstack_hosts(local: tuple[Template, Path, Any]) -> None:
    template, _, stack = local
    assert stack.stack_name == constants.LOCALSTACK_STACK_ID
    kinds = {r["Type"] for r in template.to_json()["Resources"].values()}
    assert not [k for k in kinds if k.startswith(NOT_ON_LOCALSTACK)], kinds
    assert {"AWS::SSM::Parameter", "AWS::SecretsManager::Secret", "AWS::IAM::Role", "AWS::CloudWatch::Alarm",
            "AWS::SNS::Topic", "AWS::S3::Bucket"} <= kinds
    # LocalStack's CloudFormation has no dashboard provider: one would report CREATE_COMPLETE and not
    # exist (get_dashboard: not found). The target claims none.
    assert "AWS::CloudWatch::Dashboard" not in kinds
    assert not [name for name in template.to_json()["Outputs"] if "Dashboard" in name]


def test_alarm_periods_are_what_the_target_says(local: tuple[Template, Path, Any]) -> None:
    """10 s on EMF metrics; 60 s on Metrics Insights queries, which aggregate by the minute."""
    template, _, _ = local
    periods: dict[str, tuple[str, int]] = {}
    for alarm in of_type(template.to_json()["Resources"], "AWS::CloudWatch::Alarm").values():
        props = alarm["Properties"]
        if "Metrics" not in props:
            periods[props["AlarmName"]] = ("metric", props["Period"])
            continue
        for query in props["Metrics"]:
            expression = query.get("Expression", "")
            if expression.startswith("SELECT"):
                periods[props["AlarmName"]] = ("insights", query["Period"])
            elif "MetricStat" in query:
                periods.setdefault(props["AlarmName"], ("metric", query["MetricStat"]["Period"]))
    insights = {name: period for name, (kind, period) in periods.items() if kind == "insights"}
    assert insights == {"SwitchyardLocal-core-queue-depth-above-target": 60,
                        "SwitchyardLocal-rabbitmq-dead-lettering-stranded": 60}, periods
    assert ({period for kind, period in periods.values() if kind == "metric"}
            == {constants.LOCALSTACK_ALARM_PERIOD_S})


def test_parameters_point_at_the_local_services(local: tuple[Template, Path, Any]) -> None:
    template, _, _ = local
    params = _parameters(template.to_json()["Resources"])
    prefix = "/switchyard/SwitchyardLocal/config/"
    assert all(name.startswith(prefix) for name in params)
    values = {name.removeprefix(prefix): value for name, value in params.items()}
    assert values["SWITCHYARD_AMQP_URL"] == "amqp://{username}:{password}@127.0.0.1:5672/%2F"
    assert values["SWITCHYARD_MANAGEMENT_URL"] == "http://{username}:{password}@127.0.0.1:15672"
    assert values["SWITCHYARD_REDIS_URL"] == "redis://127.0.0.1:6379/0"
    assert values["SWITCHYARD_POSTGRES_DSN"] == "postgresql://postgres@127.0.0.1:5432/switchyard"
    assert values["SWITCHYARD_KAFKA_BOOTSTRAP"] == "127.0.0.1:9092"
    assert values["SWITCHYARD_AMQP_SECRET_ARN"] == {"Ref": template_secret(template)}


def template_secret(template: Template) -> str:
    (logical,) = of_type(template.to_json()["Resources"], "AWS::SecretsManager::Secret")
    return logical


def test_both_targets_write_the_same_settings(local: tuple[Template, Path, Any], resources) -> None:
    local_names = {n.rsplit("/", 1)[1] for n in _parameters(local[0].to_json()["Resources"])}
    aws_names = {n.rsplit("/", 1)[1] for n in _parameters(resources)}
    # The AWS target's Redis and Postgres URLs take credentials from secrets; the local ones need none.
    # Its callers wait longer by default: a new key's first call waits for a Fargate task (local
    # workers start in about a second, so the library's 30 s holds there).
    assert aws_names - local_names == {"SWITCHYARD_REDIS_SECRET_ARN", "SWITCHYARD_POSTGRES_SECRET_ARN",
                                       CALL_TIMEOUT_ENV}
    assert local_names <= aws_names
    assert all(n.startswith("/switchyard/SwitchyardStack/config/SWITCHYARD_") for n in _parameters(resources))


def test_every_aws_function_reads_the_configuration_path(resources) -> None:
    for module, functions in switchyard_functions(resources).items():
        for logical, fn in functions.items():
            env = fn["Properties"]["Environment"]["Variables"]
            assert env["SWITCHYARD_CONFIG_PATH"] == "/switchyard/SwitchyardStack/config/", module
            assert "ssm:GetParametersByPath" in actions_of(policy_statements(resources, fn)), logical


def _alarms(resources: dict[str, dict[str, Any]], stack: str) -> dict[str, dict[str, Any]]:
    """The stack's alarms by their spec name (their CloudWatch names start with the stack's name)."""
    prefix = f"{stack}-"
    alarms = {r["Properties"]["AlarmName"]: r["Properties"]
              for r in of_type(resources, "AWS::CloudWatch::Alarm").values()}
    assert all(name.startswith(prefix) for name in alarms), sorted(alarms)
    return {name.removeprefix(prefix): props for name, props in alarms.items()}


def test_switchyard_alarms_are_shared_and_aws_alarms_are_not(local: tuple[Template, Path, Any],
                                                             resources) -> None:
    here = _alarms(local[0].to_json()["Resources"], local[2].stack_name)
    there = _alarms(resources, constants.STACK_ID)
    assert set(here) == set(local[2].monitoring.alarms)
    assert set(here) < set(there)
    for name, props in here.items():
        aws = there[name]
        assert props.get("MetricName") == aws.get("MetricName"), name
        for key in ("Threshold", "EvaluationPeriods", "ComparisonOperator"):
            assert props[key] == aws[key], (name, key)
        assert len(props["AlarmActions"]) == 1, name
    poison = here["core-poison-growing"]
    assert (poison["Namespace"], poison["Period"], there["core-poison-growing"]["Period"]) == (
        # each stack its own
        metrics_namespace(local[2].stack_name), constants.LOCALSTACK_ALARM_PERIOD_S, 300)
    assert not [n for n in here if "errors-or-throttles" in n or n.startswith(("postgres", "elasticache"))]


def test_an_unknown_target_is_refused() -> None:
    with pytest.raises(ConfigError, match="switchyard:target"):
        build_app(context={constants.CTX_TARGET: "gcp"})
