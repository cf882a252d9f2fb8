"""Two deployments in one account and region (staging beside production) share no physical name.

CloudFormation refuses a second resource with a name the account already holds (a broker, an MSK
cluster, an alarm...), and a shared task definition family would let one stack's control plane run
the other's workers. Every top-level property of every resource whose key is name-like is compared
between two stacks synthesized in one app: equal values collide, unless the value refers to a
resource of its own template or to the stack's name (those differ once deployed).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from aws_cdk import Stack

from stacks import constants
from stacks.application import stack_names
from stacks.config import ConfigError
from tests.stacks.nested import merged_template

pytestmark = pytest.mark.slow

NAME_LIKE = re.compile(r"(Name|Id|Identifier|Family)$")
# Name-like keys that are not account-wide names: each is scoped to a parent of its own stack.
SCOPED = {
    "StageName": "an API Gateway stage, inside its REST API",
    "DatabaseName": "the database inside its RDS instance",
    "DBName": "the database inside its RDS instance",
    "MetricName": "a metric, not a resource (its namespace and dimensions place it)",
    "CACertificateIdentifier": "the RDS certificate authority an instance uses, AWS's name",
    "ServiceName": "the AWS service a VPC endpoint reaches, not a name of ours",
    "PolicyName": "an inline policy (AWS::IAM::Policy), named within its role",
    "DisplayName": "a label shown to people, not an identity (SNS topics are named by CloudFormation)",
}


def stack_specific(value: Any, logical_ids: set[str]) -> bool:
    """Whether ``value`` refers to one of the template's own resources or to the stack's name."""
    text = json.dumps(value)
    refs = set(re.findall(r'"Ref": "([^"]+)"', text)) | set(re.findall(r'"Fn::GetAtt": \["([^"]+)"', text))
    return bool(refs & (logical_ids | {"AWS::StackName", "AWS::StackId"}))


def physical_names(template: dict[str, Any]) -> dict[str, str]:
    """JSON of each name-like value that does not differ by stack on its own -> where it is."""
    resources = template["Resources"]
    names: dict[str, str] = {}
    for logical, resource in resources.items():
        for key, value in resource.get("Properties", {}).items():
            if NAME_LIKE.search(key) and key not in SCOPED and not stack_specific(value, set(resources)):
                names[json.dumps(value, sort_keys=True)] = f"{resource['Type']} {logical}.{key}"
    return names


def test_two_stacks_in_one_app_share_no_physical_name(two_stacks: list[Stack]) -> None:
    production, staging = (physical_names(merged_template(s)) for s in two_stacks)
    assert production, "the scan found no name at all: it scans nothing"
    shared = sorted(f"{production[v]} = {v}" for v in set(production) & set(staging))
    assert not shared, "names both stacks would create in one account and region:\n" + "\n".join(shared)


def test_the_scan_sees_a_fixed_name() -> None:
    """Guard for the scan itself: a literal name counts, a reference to the stack's own resource or
    to its name does not."""
    template = {"Resources": {
        "A": {"Type": "AWS::MQ::Broker", "Properties": {"BrokerName": "fixed"}},
        "B": {"Type": "AWS::X::Y", "Properties": {
            "ClusterName": {"Ref": "A"}, "Name": {"Fn::Join": ["-", [{"Ref": "AWS::StackName"}, "x"]]}}},
    }}
    assert set(physical_names(template)) == {'"fixed"'}


@pytest.mark.parametrize("raw", ['["A", "A"]', "[]", '["1abc"]', "Staging", '{"a": 1}'])
def test_stack_names_must_be_a_list_of_distinct_valid_names(raw: str) -> None:
    with pytest.raises(ConfigError, match=constants.CTX_STACKS):
        stack_names(raw)
    assert stack_names(None) == [constants.STACK_ID]
