"""What an operator expects of a deployment before trusting it with data (issue 22, item 8): kept data
in production, a stack that `cdk destroy` can remove, gp3, the free S3 endpoint, NAT gateways per AZ,
Postgres TLS that verifies the server, and an EMR job role only this account's EMR can assume."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from stacks import constants
from stacks.config import ConfigError
from tests.stacks.conftest import synth
from tests.stacks.test_switchyard_stack import Resources, of_type, only

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def production(layer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Resources:
    """The stack as production deploys it, with a NAT gateway in each AZ (-c as the CLI passes them)."""
    template, _, _ = synth(layer_dir, tmp_path_factory.mktemp("production"),
                           **{constants.CTX_PRODUCTION: "true", constants.CTX_NAT_GATEWAYS: "2"})
    return template.to_json()["Resources"]


def test_production_protects_postgres_and_snapshots_both_stores(production: Resources) -> None:
    _, postgres = only(production, "AWS::RDS::DBInstance")
    _, redis = only(production, "AWS::ElastiCache::ReplicationGroup")
    assert postgres["Properties"]["DeletionProtection"] is True
    assert postgres["DeletionPolicy"] == postgres["UpdateReplacePolicy"] == "Snapshot"
    assert redis["DeletionPolicy"] == redis["UpdateReplacePolicy"] == "Snapshot"


def test_otherwise_destroy_removes_both_stores_and_keeps_no_snapshot(resources: Resources) -> None:
    _, postgres = only(resources, "AWS::RDS::DBInstance")
    _, redis = only(resources, "AWS::ElastiCache::ReplicationGroup")
    assert postgres["Properties"].get("DeletionProtection", False) is False
    assert postgres["DeletionPolicy"] == "Delete" and redis["DeletionPolicy"] == "Delete"


def test_the_production_flag_must_be_a_boolean(layer_dir: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="switchyard:production: must be true or false"):
        synth(layer_dir, tmp_path, **{constants.CTX_PRODUCTION: "yes"})


def test_postgres_storage_is_gp3(resources: Resources) -> None:
    _, postgres = only(resources, "AWS::RDS::DBInstance")
    assert postgres["Properties"]["StorageType"] == "gp3"


def test_every_postgres_dsn_verifies_the_server_and_its_name(resources: Resources) -> None:
    modes = re.findall(r"sslmode=([a-z-]+)", json.dumps(resources))
    assert modes and set(modes) == {"verify-full"}, modes
    _, postgres = only(resources, "AWS::RDS::DBInstance")  # signed by a CA of switchyard/core/certs
    assert postgres["Properties"]["CACertificateIdentifier"] == "rds-ca-rsa2048-g1"


def test_the_pending_streams_bucket_is_emptied_before_it_is_deleted(resources: Resources) -> None:
    buckets = {k for k, b in of_type(resources, "AWS::S3::Bucket").items() if k.startswith("PendingStreams")}
    (bucket,) = buckets
    assert resources[bucket]["DeletionPolicy"] == "Delete"
    emptied = [r["Properties"]["BucketName"] for r in resources.values()
               if r["Type"] == "Custom::S3AutoDeleteObjects"]
    assert emptied == [{"Ref": bucket}]


def _private_route_tables(resources: Resources) -> set[str]:
    return {k for k, r in of_type(resources, "AWS::EC2::RouteTable").items()
            if "private" in json.dumps(r["Properties"].get("Tags", [])).lower()}


def test_one_s3_gateway_endpoint_serves_every_private_subnet(resources: Resources) -> None:
    (endpoint,) = [e["Properties"] for e in of_type(resources, "AWS::EC2::VPCEndpoint").values()
                   if e["Properties"].get("VpcEndpointType") == "Gateway"]
    assert endpoint["ServiceName"] == {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".s3"]]}
    tables = {t["Ref"] for t in endpoint["RouteTableIds"]}
    assert _private_route_tables(resources) <= tables and len(tables) >= 4  # 2 AZs x (egress, isolated)


def _nat_of_each_egress_table(resources: Resources) -> dict[str, str]:
    return {r["Properties"]["RouteTableId"]["Ref"]: r["Properties"]["NatGatewayId"]["Ref"]
            for r in of_type(resources, "AWS::EC2::Route").values() if "NatGatewayId" in r["Properties"]}


def test_one_nat_gateway_by_default_one_per_az_when_asked(
    resources: Resources, production: Resources
) -> None:
    assert len(of_type(resources, "AWS::EC2::NatGateway")) == 1
    assert len(set(_nat_of_each_egress_table(resources).values())) == 1
    assert len(of_type(production, "AWS::EC2::NatGateway")) == constants.VPC_MAX_AZS
    per_table = _nat_of_each_egress_table(production)
    assert len(per_table) == constants.VPC_MAX_AZS and len(set(per_table.values())) == constants.VPC_MAX_AZS


@pytest.mark.parametrize("count", ["0", "3", "two"])
def test_nat_gateways_outside_one_to_the_azs_fail_synth(layer_dir: str, tmp_path: Path, count: str) -> None:
    with pytest.raises(ConfigError, match="switchyard:natGateways"):
        synth(layer_dir, tmp_path, **{constants.CTX_NAT_GATEWAYS: count})


def test_only_this_accounts_emr_serverless_may_assume_the_job_role(resources: Resources) -> None:
    (role,) = [r for k, r in of_type(resources, "AWS::IAM::Role").items() if k.startswith("AnalyticsJobRole")]
    statements: list[dict[str, Any]] = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statements == [{
        "Action": "sts:AssumeRole",
        "Condition": {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}},
        "Effect": "Allow",
        "Principal": {"Service": "emr-serverless.amazonaws.com"},
    }]
