"""The event bus's part of the template: the API, its functions, the schedule, the root key, the
worker service and the alarms (stacks/bus.py)."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Match, Template

from stacks.constants import STACK_ID


def _of_type(resources: dict[str, dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in resources.items() if v["Type"] == kind}


def _function(resources: dict[str, dict[str, Any]], module: str) -> dict[str, Any]:
    (fn,) = [r for r in _of_type(resources, "AWS::Lambda::Function").values()
             if r["Properties"].get("Handler") == f"{module}.lambda_handler"]
    return fn["Properties"]


def test_the_api_proxies_every_route_to_the_one_resolver(template: Template, resources):
    template.resource_count_is("AWS::ApiGateway::RestApi", 2)  # the bus and stacks/pending.py
    proxy = {"HttpMethod": "ANY", "Integration": Match.object_like({"Type": "AWS_PROXY"})}
    template.has_resource_properties("AWS::ApiGateway::Method", proxy)
    stage = next(iter(_of_type(resources, "AWS::ApiGateway::Stage").values()))["Properties"]
    assert stage["StageName"] == "v1" and stage["TracingEnabled"] is True
    assert "DestinationArn" in stage["AccessLogSetting"]
    api = _function(resources, "bus_api")
    assert api["Timeout"] == 29
    env = api["Environment"]["Variables"]
    assert env["SWITCHYARD_BUS_NAME"] == "main" and "SWITCHYARD_BUS_SECRET_ARN" in env
    assert "SWITCHYARD_BUS_ROOT_KEY" not in env  # the key itself never sits in the configuration


def test_the_root_key_is_a_generated_secret(resources):
    secrets = [r["Properties"] for r in _of_type(resources, "AWS::SecretsManager::Secret").values()
               if "root_key" in str(r["Properties"].get("GenerateSecretString", {}))]
    assert len(secrets) == 1
    assert secrets[0]["GenerateSecretString"]["GenerateStringKey"] == "root_key"


def test_housekeeping_runs_every_minute_one_at_a_time(resources):
    fn = _function(resources, "bus_housekeeping")
    assert fn["ReservedConcurrentExecutions"] == 1
    schedules = [r["Properties"] for r in _of_type(resources, "AWS::Scheduler::Schedule").values()
                 if "event bus" in r["Properties"].get("Description", "")]
    assert [s["ScheduleExpression"] for s in schedules] == ["rate(1 minute)"]


def test_workers_are_an_ecs_service_running_switchyard_bus_worker(resources):
    (service,) = [r["Properties"] for r in _of_type(resources, "AWS::ECS::Service").values()]
    assert service["DesiredCount"] == 2 and service["LaunchType"] == "FARGATE"
    tasks = [r["Properties"] for r in _of_type(resources, "AWS::ECS::TaskDefinition").values()
             if r["Properties"].get("Family") == f"{STACK_ID}-bus-worker"]
    (container,) = tasks[0]["ContainerDefinitions"]
    assert container["Command"] == ["bus", "worker"]
    assert [s["Name"] for s in container["Secrets"]] == ["SWITCHYARD_REDIS_PASSWORD"]
    assert container["StopTimeout"] == 120


def test_redis_admits_the_bus_workers(resources):
    ingress = [r["Properties"] for r in _of_type(resources, "AWS::EC2::SecurityGroupIngress").values()
               if "event bus workers" in r["Properties"].get("Description", "")]
    assert len(ingress) == 1 and ingress[0]["FromPort"] == 6379


def test_alarms_watch_health_autodrops_and_backlog_age(resources):
    alarms = {r["Properties"]["AlarmName"].removeprefix(f"{STACK_ID}-"): r["Properties"]
              for r in _of_type(resources, "AWS::CloudWatch::Alarm").values()}
    health = alarms["bus-unhealthy-subscriber"]
    assert (health["MetricName"], health["Threshold"], health["ComparisonOperator"]) == (
        "BusMinSubscriberHealth", 50, "LessThanThreshold")
    assert alarms["bus-backlog-age"]["MetricName"] == "BusMaxOldestEventAgeMs"
    expressions = [m.get("Expression") for m in alarms["bus-autodrop"]["Metrics"]]
    assert "DIFF(total)" in expressions
    assert "bus-api-errors-or-throttles" in alarms
    for alarm in ("bus-unhealthy-subscriber", "bus-autodrop", "bus-backlog-age"):
        assert alarms[alarm]["AlarmActions"], alarm
