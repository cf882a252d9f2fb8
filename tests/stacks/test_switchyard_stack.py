"""Property tests of the synthesized SwitchyardStack template (no AWS calls)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import App
from aws_cdk.assertions import Match, Template

from stacks import constants as c
from stacks.application import build_app
from stacks.broker import BrokerSettings
from stacks.switchyard_stack import SwitchyardStack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Template, Path]:
    """Synthesize once per module (a synth takes seconds). Fails here if cdk-nag finds anything."""
    outdir = tmp_path_factory.mktemp("cdk.out")
    app, stack = build_app(outdir=str(outdir))
    app.synth()
    return Template.from_stack(stack), outdir


@pytest.fixture(scope="module")
def template(synthesized: tuple[Template, Path]) -> Template:
    return synthesized[0]


def only_resource(template: Template, resource_type: str) -> tuple[str, dict[str, Any]]:
    resources = template.find_resources(resource_type)
    assert len(resources) == 1, f"expected one {resource_type}, found {sorted(resources)}"
    return next(iter(resources.items()))


def test_broker_is_private_rabbitmq_with_upgrades_logs_and_maintenance(template: Template) -> None:
    template.has_resource_properties(
        "AWS::AmazonMQ::Broker",
        {
            "EngineType": "RABBITMQ",
            "EngineVersion": c.DEFAULT_BROKER_ENGINE_VERSION,
            "HostInstanceType": c.DEFAULT_BROKER_INSTANCE_TYPE,
            "DeploymentMode": "SINGLE_INSTANCE",
            "PubliclyAccessible": False,
            "AutoMinorVersionUpgrade": True,
            "Logs": {"General": True},
            "MaintenanceWindowStartTime": {
                "DayOfWeek": c.BROKER_MAINTENANCE_DAY,
                "TimeOfDay": c.BROKER_MAINTENANCE_TIME,
                "TimeZone": c.BROKER_MAINTENANCE_TIME_ZONE,
            },
        },
    )


def test_broker_runs_in_one_private_subnet_with_its_security_group(template: Template) -> None:
    _, broker = only_resource(template, "AWS::AmazonMQ::Broker")
    sg_id, _ = only_resource(template, "AWS::EC2::SecurityGroup")
    props = broker["Properties"]
    assert props["SecurityGroups"] == [{"Fn::GetAtt": [sg_id, "GroupId"]}]
    assert len(props["SubnetIds"]) == 1
    subnet_id = props["SubnetIds"][0]["Ref"]
    subnet = template.to_json()["Resources"][subnet_id]
    assert subnet["Properties"]["MapPublicIpOnLaunch"] is False
    tags = {t["Key"]: t["Value"] for t in subnet["Properties"]["Tags"]}
    assert tags["aws-cdk:subnet-name"] == c.EGRESS_SUBNET_NAME


def test_broker_user_comes_from_the_generated_secret(template: Template) -> None:
    secret_id, _ = only_resource(template, "AWS::SecretsManager::Secret")
    _, broker = only_resource(template, "AWS::AmazonMQ::Broker")
    (user,) = broker["Properties"]["Users"]
    for field in ("username", "password"):
        ref = user[field.capitalize()]
        assert ref == {
            "Fn::Join": [
                "",
                ["{{resolve:secretsmanager:", {"Ref": secret_id}, f":SecretString:{field}::}}}}"],
            ]
        }


def test_secret_generation_avoids_characters_amazon_mq_refuses(template: Template) -> None:
    _, secret = only_resource(template, "AWS::SecretsManager::Secret")
    gen = secret["Properties"]["GenerateSecretString"]
    assert json.loads(gen["SecretStringTemplate"]) == {"username": c.BROKER_ADMIN_USERNAME}
    assert gen["GenerateStringKey"] == "password"
    assert gen["IncludeSpace"] is False
    assert gen["PasswordLength"] >= 12  # Amazon MQ's minimum
    for refused in ",:=":  # Amazon MQ for RabbitMQ rejects these in passwords
        assert refused in gen["ExcludeCharacters"]
    for url_special in "@/%?#":  # would break amqps://user:password@host URLs
        assert url_special in gen["ExcludeCharacters"]


def test_broker_security_group_admits_only_amqps_and_https_from_the_vpc(template: Template) -> None:
    _, vpc = only_resource(template, "AWS::EC2::VPC")
    cidr = vpc["Properties"]["CidrBlock"]
    assert cidr == c.VPC_CIDR
    _, group = only_resource(template, "AWS::EC2::SecurityGroup")
    ingress = group["Properties"]["SecurityGroupIngress"]
    assert sorted((r["IpProtocol"], r["FromPort"], r["ToPort"], r["CidrIp"]) for r in ingress) == [
        ("tcp", c.HTTPS_PORT, c.HTTPS_PORT, cidr),
        ("tcp", c.AMQPS_PORT, c.AMQPS_PORT, cidr),
    ]
    # No rule added elsewhere as a separate resource.
    template.resource_count_is("AWS::EC2::SecurityGroupIngress", 0)


def test_vpc_spans_two_azs_with_one_nat_and_private_subnets(template: Template) -> None:
    template.resource_count_is("AWS::EC2::NatGateway", 1)
    template.resource_count_is("AWS::EC2::Subnet", 3 * c.VPC_MAX_AZS)
    names = [
        {t["Key"]: t["Value"] for t in s["Properties"]["Tags"]}["aws-cdk:subnet-type"]
        for s in template.find_resources("AWS::EC2::Subnet").values()
    ]
    assert sorted(set(names)) == ["Isolated", "Private", "Public"]


def test_vpc_flow_logs_capture_all_traffic_to_cloudwatch(template: Template) -> None:
    vpc_id, _ = only_resource(template, "AWS::EC2::VPC")
    log_group_id, log_group = only_resource(template, "AWS::Logs::LogGroup")
    assert log_group["Properties"]["RetentionInDays"] == 30
    template.has_resource_properties(
        "AWS::EC2::FlowLog",
        {
            "ResourceId": {"Ref": vpc_id},
            "ResourceType": "VPC",
            "TrafficType": "ALL",
            "LogDestinationType": "cloud-watch-logs",
            "LogGroupName": {"Ref": log_group_id},
            "DeliverLogsPermissionArn": Match.any_value(),
        },
    )


def test_cdk_nag_finds_nothing_unacknowledged(synthesized: tuple[Template, Path]) -> None:
    _, outdir = synthesized
    report = json.loads((outdir / "validation-report.json").read_text())
    (nag,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert nag["conclusion"] == "success"
    assert nag["violations"] == []
    for suppressed in nag["suppressedViolations"]:
        assert len(suppressed["reason"]) > 40, f"{suppressed['ruleName']} needs a written reason"


def test_cluster_mode_spreads_broker_over_the_private_subnets() -> None:
    app = App(context={c.CTX_BROKER_DEPLOYMENT_MODE: "CLUSTER_MULTI_AZ", c.CTX_BROKER_ENGINE_VERSION: "4.2"})
    template = Template.from_stack(SwitchyardStack(app))
    _, broker = only_resource(template, "AWS::AmazonMQ::Broker")
    assert broker["Properties"]["DeploymentMode"] == "CLUSTER_MULTI_AZ"
    assert broker["Properties"]["EngineVersion"] == "4.2"
    assert len(broker["Properties"]["SubnetIds"]) == c.VPC_MAX_AZS


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
