"""The ``localstack`` target as deployed: its configuration is what the local runtime needs, its
alarms watch Switchyard's metrics and notify its topic."""

from __future__ import annotations

import json
from typing import Any

from scripts.localstack_deploy import Deployment
from stacks.localstack_stack import LOCAL_BROKER_CREDENTIALS
from switchyard.core.aws_secrets import fill
from switchyard.core.config import Connections
from switchyard.core.deployed_config import (
    ALARM_PREFIX_ENV,
    METRICS_NAMESPACE_ENV,
    config_path,
    metrics_namespace,
)

SHARED = {"SWITCHYARD_AMQP_URL", "SWITCHYARD_MANAGEMENT_URL", "SWITCHYARD_AMQP_SECRET_ARN",
          "SWITCHYARD_REDIS_URL", "SWITCHYARD_POSTGRES_DSN", "SWITCHYARD_KAFKA_BOOTSTRAP",
          "SWITCHYARD_KAFKA_AUTH",
          "SWITCHYARD_DELAY_INPUT_TOPIC", "SWITCHYARD_DELAY_OUTPUT_TOPIC", "SWITCHYARD_DELAY_SCHEMA",
          "SWITCHYARD_DELAY_CONSUMER_GROUP", ALARM_PREFIX_ENV, METRICS_NAMESPACE_ENV}


def parameters(aws: Any, path: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for page in aws("ssm").get_paginator("get_parameters_by_path").paginate(Path=path, Recursive=False):
        found.update({p["Name"].removeprefix(path): p["Value"] for p in page["Parameters"]})
    return found


def test_parameters_and_secret_give_the_local_services(localstack_deployment: Deployment, aws: Any) -> None:
    path = localstack_deployment.outputs["ConfigPath"]
    assert path == config_path(localstack_deployment.stack_name) == "/switchyard/SwitchyardLocal/config/"
    values = parameters(aws, path)
    assert set(values) == SHARED
    secret_arn = values["SWITCHYARD_AMQP_SECRET_ARN"]
    assert secret_arn == localstack_deployment.outputs["BrokerSecretArn"]
    secret = json.loads(aws("secretsmanager").get_secret_value(SecretId=secret_arn)["SecretString"])
    assert secret == LOCAL_BROKER_CREDENTIALS
    local = Connections()  # the defaults: the services ./dev runs
    assert fill(values["SWITCHYARD_AMQP_URL"], secret, "amqp") == local.amqp_url
    assert fill(values["SWITCHYARD_MANAGEMENT_URL"], secret, "management") == local.management_url
    assert values["SWITCHYARD_REDIS_URL"] == local.redis_url
    assert values["SWITCHYARD_POSTGRES_DSN"] == local.postgres_dsn
    assert values["SWITCHYARD_KAFKA_BOOTSTRAP"] == local.kafka_bootstrap
    assert values["SWITCHYARD_KAFKA_AUTH"] == "none"
    assert values[METRICS_NAMESPACE_ENV] == metrics_namespace(localstack_deployment.stack_name)


def test_alarms_watch_switchyard_metrics_and_notify_the_topic(localstack_deployment: Deployment,
                                                              aws: Any) -> None:
    topic = localstack_deployment.outputs["AlarmTopicArn"]
    aws("sns").get_topic_attributes(TopicArn=topic)  # the topic exists
    prefix = f"{localstack_deployment.stack_name}-"  # alarm names start with the stack's
    alarms = {a["AlarmName"].removeprefix(prefix): a for a in aws("cloudwatch").describe_alarms(
        AlarmNamePrefix=prefix)["MetricAlarms"]}
    poison, overdue = alarms["core-poison-growing"], alarms["delay-messages-overdue"]
    own = metrics_namespace(localstack_deployment.stack_name)  # the stack's own: no other stack's traffic
    assert (poison["Namespace"], poison["MetricName"], poison["Statistic"]) == (
        own, "DeadLetterPoisoned", "Sum")
    assert poison["Dimensions"] == [{"Name": "service", "Value": "switchyard-core"}]
    assert (poison["Period"], poison["Threshold"], poison["EvaluationPeriods"]) == (10, 1.0, 1)
    assert (overdue["MetricName"], overdue["Statistic"], overdue["EvaluationPeriods"]) == (
        "DelayMessagesOverdue", "Maximum", 2)
    assert overdue["Dimensions"] == [{"Name": "service", "Value": "switchyard-delay"}]
    names = [n.removeprefix(prefix) for n in localstack_deployment.outputs["AlarmNames"].split(",")]
    assert {"core-poison-growing", "delay-messages-overdue"} <= set(names)
    for name in names:
        alarm = alarms[name]
        assert alarm["AlarmActions"] == [topic], name
        metrics = [alarm] if "MetricName" in alarm else [m["MetricStat"]["Metric"] for m in alarm["Metrics"]
                                                          if "MetricStat" in m]
        assert all(m["Namespace"] == own for m in metrics), name
