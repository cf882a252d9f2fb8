"""Property tests of the synthesized SwitchyardStack template (no AWS calls), one part at a time."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from stacks import constants
from stacks.broker import BrokerSettings
from stacks.config import DelayConfig
from stacks.parameters import DELAY_CONSUMER_GROUP, SCHEDULED_CONSUMER_GROUP
from switchyard.core.observability import SCHEDULED_SERVICE
from tests.stacks.conftest import ROOT, synth

pytestmark = pytest.mark.slow

Resources = dict[str, dict[str, Any]]
RUNTIME_HANDLERS = {
    "rpc_orphans",
    "rpc_dead_letters",
    "rpc_activity",
    "rpc_reconcile",
    "delay_enqueue",
    "delay_fire",
    "delay_sweep",
    "rpc_scheduled",
}
DEPLOY_HANDLERS = {"deploy_pools", "deploy_delay_schema", "deploy_topics"}
# Handlers of parts whose deployment (API Gateway, their schedules) comes with their own issues
# (pending request queue, event bus). Listed, so that a new handler file forces a decision here.
NOT_YET_DEPLOYED: set[str] = set()
BUS_HANDLERS = {"bus_api", "bus_housekeeping"}  # stacks/bus.py; tests/stacks/test_bus_stack.py
PENDING_HANDLERS = {"pending_api"}  # stacks/pending.py; tests/stacks/test_pending_stack.py


def of_type(resources: Resources, kind: str) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in resources.items() if r["Type"] == kind}


def only(resources: Resources, kind: str) -> tuple[str, dict[str, Any]]:
    found = of_type(resources, kind)
    assert len(found) == 1, f"expected one {kind}, found {sorted(found)}"
    return next(iter(found.items()))


def switchyard_functions(resources: Resources) -> dict[str, dict[str, Any]]:
    """Our functions by handler module (``rpc_orphans``), not CDK's own helper functions."""
    found: dict[str, dict[str, Any]] = {}
    for logical, fn in of_type(resources, "AWS::Lambda::Function").items():
        module = fn["Properties"].get("Handler", "").split(".")[0]
        if module in RUNTIME_HANDLERS | DEPLOY_HANDLERS | BUS_HANDLERS | PENDING_HANDLERS:
            found.setdefault(module, {})[logical] = fn
    return found


def one_function(resources: Resources, module: str) -> tuple[str, dict[str, Any]]:
    (item,) = switchyard_functions(resources)[module].items()
    return item


def policy_statements(resources: Resources, function: dict[str, Any]) -> list[dict[str, Any]]:
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    statements = []
    for policy in of_type(resources, "AWS::IAM::Policy").values():
        if {"Ref": role} in policy["Properties"]["Roles"]:
            statements += policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


def actions_of(statements: list[dict[str, Any]]) -> set[str]:
    found: set[str] = set()
    for s in statements:
        found.update([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    return found


def ingress(resources: Resources, group: str) -> set[tuple[int, str]]:
    """(port, source group logical id) admitted by ``group`` through separate ingress resources."""
    rules = set()
    for rule in of_type(resources, "AWS::EC2::SecurityGroupIngress").values():
        props = rule["Properties"]
        if props["GroupId"] == {"Fn::GetAtt": [group, "GroupId"]}:
            rules.add((props["FromPort"], props["SourceSecurityGroupId"]["Fn::GetAtt"][0]))
    return rules


def group_id(resources: Resources, construct_id: str) -> str:
    (logical,) = [k for k in of_type(resources, "AWS::EC2::SecurityGroup") if construct_id in k]
    return logical


# -- network ------------------------------------------------------------------------------------
def test_vpc_spans_two_azs_with_one_nat_and_private_subnets(template: Template) -> None:
    template.resource_count_is("AWS::EC2::NatGateway", 1)
    template.resource_count_is("AWS::EC2::Subnet", 3 * constants.VPC_MAX_AZS)
    template.has_resource_properties(
        "AWS::EC2::FlowLog",
        {"ResourceType": "VPC", "TrafficType": "ALL", "LogDestinationType": "cloud-watch-logs"},
    )


def test_no_security_group_admits_anything_from_a_cidr(resources: Resources) -> None:
    for group in of_type(resources, "AWS::EC2::SecurityGroup").values():
        assert group["Properties"].get("SecurityGroupIngress", []) == [], group["Properties"][
            "GroupDescription"
        ]
    for rule in of_type(resources, "AWS::EC2::SecurityGroupIngress").values():
        assert "CidrIp" not in rule["Properties"] and "CidrIpv6" not in rule["Properties"]


def test_each_data_service_admits_its_port_from_exactly_its_clients(resources: Resources) -> None:
    functions, workers, emr = (
        group_id(resources, n) for n in ("FunctionsSecurityGroup", "WorkersSecurityGroup", "EmrSecurityGroup")
    )
    broker, redis, postgres, msk = (
        group_id(resources, n)
        for n in ("BrokerSecurityGroup", "RedisSecurityGroup", "PostgresSecurityGroup", "MskSecurityGroup")
    )
    assert ingress(resources, broker) == {
        (port, src) for port in (constants.AMQPS_PORT, constants.HTTPS_PORT)
        for src in (functions, workers, emr, broker)
    }
    bus_workers = group_id(resources, "BusDeliverySecurityGroup")
    apis = group_id(resources, "PublicApiSecurityGroup")  # the public APIs' functions: Redis only
    assert ingress(resources, redis) == {(constants.REDIS_PORT, functions),
                                         (constants.REDIS_PORT, bus_workers),
                                         (constants.REDIS_PORT, apis)}
    assert ingress(resources, postgres) == {(constants.POSTGRES_PORT, functions)}
    assert ingress(resources, msk) == {(constants.MSK_IAM_PORT, src) for src in (functions, emr, msk)}
    for client in (functions, workers, emr, apis):
        assert ingress(resources, client) == set()


# -- Amazon MQ -----------------------------------------------------------------------------------
def test_broker_is_private_rabbitmq_4_2_by_default(template: Template) -> None:
    template.has_resource_properties(
        "AWS::AmazonMQ::Broker",
        {
            "EngineType": "RABBITMQ",
            "EngineVersion": "4.2",
            "HostInstanceType": constants.DEFAULT_BROKER_INSTANCE_TYPE,
            "DeploymentMode": "SINGLE_INSTANCE",
            "PubliclyAccessible": False,
            "AutoMinorVersionUpgrade": True,
            "Logs": {"General": True},
        },
    )


def test_broker_user_comes_from_the_generated_secret(resources: Resources) -> None:
    _, broker = only(resources, "AWS::AmazonMQ::Broker")
    (user,) = broker["Properties"]["Users"]
    secret = next(k for k in of_type(resources, "AWS::SecretsManager::Secret") if "BrokerAdminSecret" in k)
    for field in ("username", "password"):
        assert user[field.capitalize()] == {
            "Fn::Join": ["", ["{{resolve:secretsmanager:", {"Ref": secret}, f":SecretString:{field}::}}}}"]]
        }
    gen = resources[secret]["Properties"]["GenerateSecretString"]
    for refused in ",:=@/%?#":  # Amazon MQ refuses ,:= and the rest would break amqps:// URLs
        assert refused in gen["ExcludeCharacters"]


def test_the_emr_image_context_attaches_the_custom_image(layer_dir: str, tmp_path: Path) -> None:
    image = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/switchyard-emr:7.9.0-py311"
    template, _, _ = synth(layer_dir, tmp_path, **{constants.CTX_EMR_IMAGE: image})
    (application,) = template.find_resources("AWS::EMRServerless::Application").values()
    assert application["Properties"]["ImageConfiguration"] == {"ImageUri": image}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"deployment_mode": "ACTIVE_STANDBY_MULTI_AZ"}, "must be one of"),
        ({"engine_version": "4.2", "instance_type": "mq.m5.large"}, "only on mq.m7g"),
    ],
)
def test_broker_settings_reject_what_amazon_mq_would(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BrokerSettings(**settings)


def test_pools_are_declared_on_deploy_by_a_custom_resource(resources: Resources) -> None:
    _, pools = only(resources, "Custom::SwitchyardPools")
    assert pools["Properties"]["Pools"] == [constants.EXAMPLE_POOL]
    assert re.fullmatch(r"[0-9a-f]{16}", pools["Properties"]["CodeVersion"])  # re-runs when the code changes
    _, fn = one_function(resources, "deploy_pools")
    env = fn["Properties"]["Environment"]["Variables"]
    assert "{password}" in json.dumps(env["SWITCHYARD_AMQP_URL"])  # filled from the secret at run time
    assert "SWITCHYARD_AMQP_SECRET_ARN" in env


# -- MSK, RDS, ElastiCache ----------------------------------------------------------------------------
def test_msk_uses_iam_auth_and_tls_only(template: Template, resources: Resources) -> None:
    template.has_resource_properties(
        "AWS::MSK::Cluster",
        {
            "ClientAuthentication": {
                "Sasl": {"Iam": {"Enabled": True}},
                "Unauthenticated": {"Enabled": False},
            },
            "EncryptionInfo": {"EncryptionInTransit": {"ClientBroker": "TLS", "InCluster": True}},
            "NumberOfBrokerNodes": 2,
        },
    )
    _, topics = only(resources, "Custom::SwitchyardTopics")
    assert topics["Properties"]["Topics"] == ["switchyard-delay-input", "switchyard-delay-output"]
    assert topics["Properties"]["Partitions"] == 3
    assert topics["Properties"]["ReplicationFactor"] == 2


def test_postgres_is_encrypted_private_and_migrated_on_deploy(
    template: Template, resources: Resources
) -> None:
    template.has_resource_properties(
        "AWS::RDS::DBInstance",
        {
            "Engine": "postgres",
            "StorageEncrypted": True,
            "PubliclyAccessible": False,
            "MasterUserPassword": Match.any_value(),
        },
    )
    db, _ = only(resources, "AWS::RDS::DBInstance")
    schema_id, schema = only(resources, "Custom::SwitchyardDelaySchema")
    assert schema["Properties"]["Schema"] == "switchyard_delay"
    assert db in template.to_json()["Resources"][schema_id]["DependsOn"]


def test_elasticache_has_tls_and_an_auth_token_from_secrets_manager(resources: Resources) -> None:
    _, group = only(resources, "AWS::ElastiCache::ReplicationGroup")
    props = group["Properties"]
    assert props["TransitEncryptionEnabled"] is True and props["AtRestEncryptionEnabled"] is True
    assert "{{resolve:secretsmanager:" in json.dumps(props["AuthToken"])


# -- Lambda --------------------------------------------------------------------------------------------
def test_every_handler_is_deployed_with_layer_tracing_vpc_and_powertools(resources: Resources) -> None:
    functions = switchyard_functions(resources)
    assert set(functions) == RUNTIME_HANDLERS | DEPLOY_HANDLERS | BUS_HANDLERS | PENDING_HANDLERS
    shipped = {p.stem for p in (ROOT / "functions").glob("*.py")}
    assert set(functions) | NOT_YET_DEPLOYED == shipped, "every file in functions/ is a deployed handler"
    ((layer, _),) = of_type(resources, "AWS::Lambda::LayerVersion").items()
    for module, fns in functions.items():
        for fn in fns.values():
            props = fn["Properties"]
            # tests/stacks/test_platform.py
            assert props["Runtime"] == f"python{constants.PYTHON_VERSION}", module
            assert props["Layers"] == [{"Ref": layer}], module
            assert props["TracingConfig"] == {"Mode": "Active"}, module  # X-Ray joins the W3C traces
            assert props["VpcConfig"]["SecurityGroupIds"], module
            env = props["Environment"]["Variables"]
            # its own
            assert env["POWERTOOLS_METRICS_NAMESPACE"] == f"Switchyard/{constants.STACK_ID}", module
            assert env["POWERTOOLS_SERVICE_NAME"].startswith("switchyard-"), module
            assert env["POWERTOOLS_LOG_LEVEL"] == "INFO", module
            assert "POWERTOOLS_TRACE_DISABLED" not in env, module  # Powertools' Tracer records the segment
            assert "SWITCHYARD_TRACE_LOG" not in env, module  # a function never writes the local trace log


def test_the_fire_loop_warns_past_the_alarms_lateness_sla(resources: Resources) -> None:
    """The delay functions log a warning past the same SLA the lateness alarm is set on."""
    functions = switchyard_functions(resources)
    for module in ("delay_enqueue", "delay_fire", "delay_sweep"):
        (fn,) = functions[module].values()
        env = fn["Properties"]["Environment"]["Variables"]
        assert env["SWITCHYARD_DELAY_LATENESS_SLA_MS"] == str(DelayConfig().lateness_sla_ms), module


def test_reserved_concurrency_where_a_handler_must_not_pile_up(resources: Resources) -> None:
    def reserved(module: str) -> Any:
        return one_function(resources, module)[1]["Properties"].get("ReservedConcurrentExecutions")

    assert reserved("rpc_reconcile") == 1
    assert reserved("delay_fire") == constants.FIRE_RESERVED_CONCURRENCY
    assert reserved("delay_sweep") == constants.SWEEP_RESERVED_CONCURRENCY
    # Amazon MQ mappings invoke one environment at a time anyway; enqueue scales with partitions.
    assert reserved("rpc_orphans") is None and reserved("delay_enqueue") is None


def test_no_secret_value_in_any_function_or_task_configuration(resources: Resources) -> None:
    for kind in ("AWS::Lambda::Function", "AWS::ECS::TaskDefinition"):
        for logical, res in of_type(resources, kind).items():
            text = json.dumps(res["Properties"])
            assert "resolve:secretsmanager" not in text, logical  # no dynamic reference resolved into env
            assert "SecretString" not in text, logical


DATA_SERVICES = (
    "kafka",
    "kafka-cluster",
    "secretsmanager",
    "rds",
    "rds-db",
    "elasticache",
    "mq",
    "s3",
    "ecs",
    "dynamodb",
    "sqs",
    "sns",
)


def test_iam_no_wildcard_action_and_no_wildcard_resource_on_a_data_service(resources: Resources) -> None:
    for logical, policy in of_type(resources, "AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = actions_of([statement])
            assert "*" not in actions, logical
            assert not any(a.split(":")[1] == "*" for a in actions), (logical, actions)
            if statement.get("Resource") == "*":
                assert not any(a.split(":")[0] in DATA_SERVICES for a in actions), (logical, actions)


def test_each_function_reaches_only_its_own_services(resources: Resources) -> None:
    def services(module: str) -> set[str]:
        return {
            a.split(":")[0]
            for a in actions_of(policy_statements(resources, one_function(resources, module)[1]))
        }

    assert services("rpc_orphans") >= {"ecs", "iam", "secretsmanager", "mq"}
    assert "kafka-cluster" not in services("rpc_orphans")
    assert "ecs" not in services("rpc_dead_letters") and "ecs" not in services("rpc_activity")
    assert "kafka-cluster" not in services("delay_sweep")
    assert "ecs" not in services("delay_fire")
    fire = actions_of(policy_statements(resources, one_function(resources, "delay_fire")[1]))
    assert "kafka-cluster:WriteData" in fire and "kafka-cluster:ReadData" not in fire
    enqueue = actions_of(policy_statements(resources, one_function(resources, "delay_enqueue")[1]))
    assert {"kafka-cluster:ReadData", "kafka-cluster:AlterGroup", "kafka:DescribeClusterV2"} <= enqueue
    secret_reads = [
        s
        for s in policy_statements(resources, one_function(resources, "rpc_orphans")[1])
        if "secretsmanager:GetSecretValue" in actions_of([s])
    ]
    assert all(s["Resource"] != "*" for s in secret_reads)


# -- event sources and schedules -----------------------------------------------------------------
def test_amazon_mq_mappings_for_the_three_queues_of_every_pool(resources: Resources) -> None:
    broker, _ = only(resources, "AWS::AmazonMQ::Broker")
    # The pollers log in as the pool's mappings user (tests/stacks/test_broker_users.py), not the admin.
    secret = next(k for k in of_type(resources, "AWS::SecretsManager::Secret") if "mappings" in k)
    mq = {
        m["Properties"]["Queues"][0]: m["Properties"]
        for m in of_type(resources, "AWS::Lambda::EventSourceMapping").values()
        if "Queues" in m["Properties"]
    }
    assert set(mq) == {f"{constants.EXAMPLE_POOL}-orphan", f"{constants.EXAMPLE_POOL}-dl",
                       f"{constants.EXAMPLE_POOL}-activity"}
    handler_of = {
        f"{constants.EXAMPLE_POOL}-orphan": "rpc_orphans",
        f"{constants.EXAMPLE_POOL}-dl": "rpc_dead_letters",
        f"{constants.EXAMPLE_POOL}-activity": "rpc_activity",
    }
    for queue, props in mq.items():
        assert props["EventSourceArn"] == {"Fn::GetAtt": [broker, "Arn"]}
        assert props["SourceAccessConfigurations"] == [
            {"Type": "BASIC_AUTH", "URI": {"Ref": secret}},
            {"Type": "VIRTUAL_HOST", "URI": "/"},
        ]
        assert props["BatchSize"] == 100 and props["MaximumBatchingWindowInSeconds"] == 1
        assert props["FunctionName"] == {"Ref": one_function(resources, handler_of[queue])[0]}


def msk_mappings(resources: Resources) -> dict[str, dict[str, Any]]:
    """Topic -> its MSK mapping's properties."""
    found = [m["Properties"] for m in of_type(resources, "AWS::Lambda::EventSourceMapping").values()
             if "Topics" in m["Properties"]]
    return {props["Topics"][0]: props for props in found}


def test_msk_mapping_reports_batch_item_failures(resources: Resources) -> None:
    props = msk_mappings(resources)["switchyard-delay-input"]
    kafka, _ = only(resources, "AWS::MSK::Cluster")
    assert props["EventSourceArn"] == {"Fn::GetAtt": [kafka, "Arn"]}
    assert props["Topics"] == ["switchyard-delay-input"]
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert props["StartingPosition"] == "TRIM_HORIZON" and props["BatchSize"] == 1000
    assert props["FunctionName"] == {"Ref": one_function(resources, "delay_enqueue")[0]}


def test_the_scheduled_call_relay_reads_the_output_topic_in_its_own_group_as_its_own_user(
        resources: Resources) -> None:
    props = msk_mappings(resources)["switchyard-delay-output"]
    logical, relay = one_function(resources, "rpc_scheduled")
    assert props["FunctionName"] == {"Ref": logical}
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert props["MaximumBatchingWindowInSeconds"] == 0 and "ProvisionedPollerConfig" in props
    group = props["AmazonManagedKafkaEventSourceConfig"]["ConsumerGroupId"]
    assert group == SCHEDULED_CONSUMER_GROUP != DELAY_CONSUMER_GROUP
    statements = policy_statements(resources, relay)
    actions = actions_of(statements)
    assert {"kafka-cluster:ReadData", "kafka-cluster:AlterGroup"} <= actions
    assert "kafka-cluster:WriteData" not in actions and "ecs:RunTask" not in actions
    groups = [s["Resource"] for s in statements if "kafka-cluster:AlterGroup" in actions_of([s])]
    assert f"/{SCHEDULED_CONSUMER_GROUP}" in json.dumps(groups)
    assert f"/{DELAY_CONSUMER_GROUP}\"" not in json.dumps(groups)
    # it publishes as the deployment-wide scheduled user, and may read the delay store's secret to park
    user = next(k for k in of_type(resources, "AWS::SecretsManager::Secret") if "scheduled" in k)
    secrets = json.dumps([s["Resource"] for s in statements
                          if "secretsmanager:GetSecretValue" in actions_of([s])])
    assert user in secrets
    env = relay["Properties"]["Environment"]["Variables"]
    assert env["POWERTOOLS_SERVICE_NAME"] == SCHEDULED_SERVICE
    assert env["SWITCHYARD_AMQP_SECRET_ARN"] == {"Ref": user}


def test_schedules_invoke_reconcile_fire_and_sweep_every_minute(resources: Resources) -> None:
    targets = {}
    for schedule in of_type(resources, "AWS::Scheduler::Schedule").values():
        props = schedule["Properties"]
        assert props["ScheduleExpression"] == "rate(1 minute)"
        assert props["FlexibleTimeWindow"] == {"Mode": "OFF"}
        targets[props["Target"]["Arn"]["Fn::GetAtt"][0]] = props["Target"]["RetryPolicy"]
    assert set(targets) == {
        one_function(resources, m)[0]
        for m in ("rpc_reconcile", "delay_fire", "delay_sweep", "bus_housekeeping")
    }


# -- ECS --------------------------------------------------------------------------------------------
def test_worker_task_definition_injects_the_amqp_secret_and_stops_in_two_stages(resources: Resources) -> None:
    (props,) = [t["Properties"] for t in of_type(resources, "AWS::ECS::TaskDefinition").values()
                if t["Properties"]["Family"].startswith(
                    f"{constants.STACK_ID}-{constants.WORKER_FAMILY_SUFFIX}")]
    assert props["Family"] == f"{constants.STACK_ID}-worker-{constants.EXAMPLE_POOL}"
    assert props["RequiresCompatibilities"] == ["FARGATE"] and props["NetworkMode"] == "awsvpc"
    assert (props["Cpu"], props["Memory"]) == ("256", "512")
    (container,) = props["ContainerDefinitions"]
    assert container["Name"] == constants.WORKER_CONTAINER
    assert container["Command"] == ["worker", "--handler", "switchyard.rpc.examples:describe"]
    assert container["StopTimeout"] == constants.WORKER_STOP_TIMEOUT_S
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    assert {s["Name"] for s in container["Secrets"]} == {
        "SWITCHYARD_AMQP_USERNAME",
        "SWITCHYARD_AMQP_PASSWORD",
    }
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert "{password}" in json.dumps(env["SWITCHYARD_AMQP_URL"])
    assert not any("PASSWORD" in name for name in env)


def test_control_plane_drives_the_pools_task_definition_on_ecs(resources: Resources) -> None:
    _, orphans = one_function(resources, "rpc_orphans")
    env = orphans["Properties"]["Environment"]["Variables"]
    assert env["SWITCHYARD_RPC_DRIVER"] == "ecs"
    assert (env["SWITCHYARD_RPC_ECS_TASK_DEFINITION"]
            == f"{constants.STACK_ID}-worker-{constants.EXAMPLE_POOL}")
    assert (
        env["SWITCHYARD_RPC_MIN_WORKERS"],
        env["SWITCHYARD_RPC_MAX_WORKERS"],
        env["SWITCHYARD_RPC_TARGET_BACKLOG"],
    ) == ("1", "4", "10")
    statements = policy_statements(resources, orphans)
    run = [s for s in statements if "ecs:RunTask" in actions_of([s])]
    assert run and all("ecs:cluster" in json.dumps(s["Condition"]) for s in run)
    passes = [s for s in statements if "iam:PassRole" in actions_of([s])]
    assert passes[0]["Condition"] == {"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}}
    _, dead = one_function(resources, "rpc_dead_letters")
    assert dead["Properties"]["Environment"]["Variables"]["SWITCHYARD_RPC_DRIVER"] == "noop"


# -- CloudWatch ------------------------------------------------------------------------------------------
def test_every_alarm_says_why_and_notifies_the_topic(resources: Resources) -> None:
    topic, _ = only(resources, "AWS::SNS::Topic")
    alarms = of_type(resources, "AWS::CloudWatch::Alarm")
    assert alarms
    for logical, alarm in alarms.items():
        props = alarm["Properties"]
        assert len(props["AlarmDescription"]) > 60, logical
        assert props["AlarmActions"] == [{"Ref": topic}], logical
        # silence breaches only a heartbeat (a loop that stopped reports nothing)
        heartbeat = props["AlarmName"].endswith("-heartbeat")
        assert props["TreatMissingData"] == ("breaching" if heartbeat else "notBreaching"), logical
    only(resources, "AWS::CloudWatch::Dashboard")


def alarm(resources: Resources, name: str) -> dict[str, Any]:
    (found,) = [
        a["Properties"]
        for a in of_type(resources, "AWS::CloudWatch::Alarm").values()
        if a["Properties"]["AlarmName"] == f"{constants.STACK_ID}-{name}"
    ]
    return found


def test_alarm_metrics_and_thresholds(resources: Resources) -> None:
    pool = constants.EXAMPLE_POOL
    poison = alarm(resources, f"{pool}-poison-growing")
    assert (poison["MetricName"], poison["Threshold"]) == ("DeadLetterPoisoned", 1)
    assert poison["Dimensions"] == [{"Name": "service", "Value": f"switchyard-{pool}"}]
    expiring = alarm(resources, f"{pool}-requests-expiring")
    assert (expiring["MetricName"], expiring["Threshold"]) == ("DeadLetterExpired", 10)
    rejected = json.dumps(alarm(resources, f"{pool}-requests-rejected")["Metrics"])
    assert "DeadLetterRejected" in rejected and "DeadLetterMaxlen" in rejected
    depth = alarm(resources, f"{pool}-queue-depth-above-target")
    assert depth["Threshold"] == 4 * 10 and depth["EvaluationPeriods"] == 5
    assert "MAX(QueueDepth)" in json.dumps(depth["Metrics"]) and f"switchyard-{pool}" in json.dumps(
        depth["Metrics"]
    )
    overdue = alarm(resources, "delay-messages-overdue")
    assert (overdue["MetricName"], overdue["Statistic"], overdue["EvaluationPeriods"]) == (
        "DelayMessagesOverdue", "Maximum", 2)
    lateness = alarm(resources, "delay-lateness-p999-above-sla")
    assert (lateness["ExtendedStatistic"], lateness["Threshold"]) == ("p99.9", 500)
    assert alarm(resources, "delay-sweep-takeovers")["MetricName"] == "DelaySuspectedFailures"
    assert alarm(resources, "delay-msk-offset-lag")["MetricName"] == "OffsetLag"
    assert alarm(resources, "postgres-connections-near-limit")["Threshold"] == 160  # 80% of 200
    assert alarm(resources, "elasticache-memory")["MetricName"] == "DatabaseMemoryUsagePercentage"
    starts = json.dumps(alarm(resources, f"{pool}-worker-group-start-failures")["Metrics"])
    assert "OrphanGroupStartFailures" in starts and "ReconcileDriverErrors" in starts
    assert alarm(resources, f"{pool}-orphan-forwarding-failures")["MetricName"] == "Errors"
    stranded = alarm(resources, "rabbitmq-dead-lettering-stranded")  # the reconciler's broker probe
    assert "MAX(ReconcileDeadLetteringStranded)" in json.dumps(stranded["Metrics"])
    assert stranded["Threshold"] == 1 and "reboot" in stranded["AlarmDescription"]
    for module in RUNTIME_HANDLERS - {"rpc_scheduled"}:
        role = module.replace("rpc_", f"{pool}-").replace("delay_", "delay-")
        assert "Throttles" in json.dumps(alarm(resources, f"{role}-errors-or-throttles")["Metrics"])
    assert "Throttles" in json.dumps(alarm(resources, "scheduled-relay-errors-or-throttles")["Metrics"])
    refused = json.dumps(alarm(resources, "scheduled-calls-refused")["Metrics"])
    assert all(name in refused for name in ("ScheduledUnknownPool", "ScheduledMalformed",
                                            "ScheduledExpired", "ScheduledUnroutable"))
    assert "switchyard-scheduled" in refused
    failures = alarm(resources, "scheduled-calls-publish-failures")
    assert (failures["MetricName"], failures["EvaluationPeriods"]) == ("ScheduledPublishFailures", 2)


# -- EMR Serverless ------------------------------------------------------------------------------------
def test_emr_serverless_application_bucket_and_job_role(template: Template, resources: Resources) -> None:
    template.has_resource_properties(
        "AWS::EMRServerless::Application",
        {
            "Type": "SPARK",
            "ReleaseLabel": constants.EMR_RELEASE,
            "NetworkConfiguration": {"SecurityGroupIds": Match.any_value(), "SubnetIds": Match.any_value()},
            "ImageConfiguration": Match.absent(),  # EMR's own image unless switchyard:emrImage says
        },
    )
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            }
        },
    )
    (role,) = [
        r
        for r in of_type(resources, "AWS::IAM::Role").values()
        if "emr-serverless" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    ]
    # What the job does on MSK: schedule rows through the delay input topic, idempotently.
    role_id = next(k for k, v in of_type(resources, "AWS::IAM::Role").items() if v is role)
    actions = {
        action
        for policy in of_type(resources, "AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        for action in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    }
    wanted = {"kafka-cluster:Connect", "kafka-cluster:WriteData", "kafka-cluster:WriteDataIdempotently"}
    assert wanted <= actions
    assert "kafka-cluster:ReadData" not in actions


# -- configuration and cdk-nag -------------------------------------------------------------------------
def test_two_pools_get_their_own_functions_mappings_schedules_and_tasks(
    layer_dir: str, tmp_path: Path
) -> None:
    pools = [
        {"name": "core"},
        {"name": "gpu", "cpu": 1024, "memoryMib": 4096, "maxWorkers": 2, "batchSize": 50},
    ]
    template, _, _ = synth(layer_dir, tmp_path, **{constants.CTX_POOLS: pools})
    resources = template.to_json()["Resources"]
    assert len(switchyard_functions(resources)["rpc_orphans"]) == 2
    queues = {
        m["Properties"]["Queues"][0]: m["Properties"]["BatchSize"]
        for m in of_type(resources, "AWS::Lambda::EventSourceMapping").values()
        if "Queues" in m["Properties"]
    }
    assert queues == {
        "core-orphan": 100,
        "core-dl": 100,
        "core-activity": 100,
        "gpu-orphan": 50,
        "gpu-dl": 50,
        "gpu-activity": 50,
    }
    template.resource_count_is("AWS::Scheduler::Schedule", 5)  # 2 reconcilers, fire, sweep, bus
    families = {
        t["Properties"]["Family"]: t["Properties"]["Memory"]
        for t in of_type(resources, "AWS::ECS::TaskDefinition").values()
    }
    assert families == {f"{constants.STACK_ID}-worker-core": "512",
                        f"{constants.STACK_ID}-worker-gpu": "4096",
                        f"{constants.STACK_ID}-bus-worker": "1024"}
    (pools_cr,) = template.find_resources("Custom::SwitchyardPools").values()
    assert pools_cr["Properties"]["Pools"] == ["core", "gpu"]


def test_cdk_nag_finds_nothing_unacknowledged(synthesized: tuple[Template, Path, Any]) -> None:
    report = json.loads((synthesized[1] / "validation-report.json").read_text())
    (nag,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert nag["conclusion"] == "success"
    assert nag["violations"] == []
    for suppressed in nag["suppressedViolations"]:
        assert len(suppressed["reason"]) > 40, f"{suppressed['ruleName']} needs a written reason"
