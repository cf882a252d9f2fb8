"""Custom resources depend on what they read: CloudFormation creates resources in parallel unless
one names the other, and no emulator here runs a deploy in AWS's order (LocalStack's deploys one
resource after another). A custom resource's function reads at run time the deployed configuration
(every SSM parameter under its ``SWITCHYARD_CONFIG_PATH``), the secrets and services its environment
and its role's policies name: each must be created before the resource runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.iam_policy import references

Resources = Mapping[str, Mapping[str, Any]]


def depends_on(resources: Resources, logical: str) -> set[str]:
    """Every resource CloudFormation creates before ``logical`` (DependsOn and references, transitively)."""
    seen: set[str] = set()
    todo = [logical]
    while todo:
        res = resources[todo.pop()]
        direct = res.get("DependsOn", [])
        named = [*([direct] if isinstance(direct, str) else direct), *references(res.get("Properties", {}))]
        for dep in named:
            if dep in resources and dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def function_of(resources: Resources, custom: str) -> str:
    """The user function a custom resource's provider framework invokes."""
    provider = resources[custom]["Properties"]["ServiceToken"]["Fn::GetAtt"][0]
    variables = resources[provider]["Properties"]["Environment"]["Variables"]
    return variables["USER_ON_EVENT_FUNCTION_ARN"]["Fn::GetAtt"][0]


def reads(resources: Resources, function: str) -> set[str]:
    """What ``function`` reads at run time: its configuration parameters, what its environment names,
    its role and the policies attached to it, and what those policies grant access to."""
    props = resources[function]["Properties"]
    variables = props.get("Environment", {}).get("Variables", {})
    path = variables.get("SWITCHYARD_CONFIG_PATH")
    wanted = {k for k, v in resources.items() if path and v["Type"] == "AWS::SSM::Parameter"
              and str(v["Properties"]["Name"]).startswith(path)}
    wanted |= set(references(variables))
    role = props["Role"]["Fn::GetAtt"][0]
    for logical, res in resources.items():
        if res["Type"] == "AWS::IAM::Policy" and {"Ref": role} in res["Properties"]["Roles"]:
            wanted |= {logical, *references(res["Properties"]["PolicyDocument"])}
    return {r for r in wanted if r in resources and resources[r]["Type"] != "AWS::Lambda::LayerVersion"}


def test_custom_resources_depend_on_what_they_read(resources: dict[str, dict[str, Any]]) -> None:
    customs = [k for k, v in resources.items() if v["Type"].startswith("Custom::Switchyard")]
    assert len(customs) >= 3, customs  # pools, delay schema, topics
    missing = {}
    for custom in customs:
        needed = reads(resources, function_of(resources, custom))
        assert any(resources[r]["Type"] == "AWS::SSM::Parameter" for r in needed), custom  # the check bites
        absent = needed - depends_on(resources, custom)
        if absent:
            missing[custom] = sorted(absent)
    assert not missing, "custom resources that may run before what they read exists:\n" + "\n".join(
        f"{custom}: {', '.join(names)}" for custom, names in missing.items())
