"""Each event source mapping's network path, checked on the template (no emulator simulates it).

A mapping's pollers run in the event source's subnets (the MSK cluster's, the broker's) and, in
on-demand mode, must reach Lambda and STS from there: a default route to a NAT gateway, or interface
endpoints for both (AWS, "Configuring your Amazon MSK cluster and Amazon VPC network for Lambda";
for Amazon MQ: Lambda and Secrets Manager). A Kafka mapping in provisioned mode
(``ProvisionedPollerConfig``) needs neither, and partial batch response on a Kafka mapping is an
error handling control of provisioned mode ("Configuring error handling controls for Kafka event
sources"). What this ignores: network ACLs (the stack makes none) and security group rules (covered
by tests/stacks/test_switchyard_stack.py).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.stacks.test_switchyard_stack import Resources, of_type

pytestmark = pytest.mark.slow

# What the pollers call, per source type, when they poll from the source's subnets.
NEEDED_SERVICES = {
    "AWS::MSK::Cluster": ("lambda", "sts"),
    "AWS::AmazonMQ::Broker": ("lambda", "secretsmanager"),
}


def _ref(value: Any) -> str | None:
    """The logical id a ``Ref`` or ``Fn::GetAtt`` names, if that is what ``value`` is."""
    if isinstance(value, dict):
        if "Ref" in value:
            return value["Ref"]
        if "Fn::GetAtt" in value:
            return value["Fn::GetAtt"][0]
    return None


def _source_subnets(source: dict[str, Any]) -> list[str]:
    props = source["Properties"]
    if source["Type"] == "AWS::MSK::Cluster":
        subnets = props["BrokerNodeGroupInfo"]["ClientSubnets"]
    else:
        subnets = props["SubnetIds"]
    return [_ref(s) or str(s) for s in subnets]


def _nat_routed(resources: Resources, subnet: str) -> bool:
    """Whether the subnet's route table sends 0.0.0.0/0 to a NAT gateway."""
    tables = {_ref(a["Properties"]["RouteTableId"])
              for a in of_type(resources, "AWS::EC2::SubnetRouteTableAssociation").values()
              if _ref(a["Properties"]["SubnetId"]) == subnet}
    return any(
        _ref(r["Properties"]["RouteTableId"]) in tables
        and r["Properties"].get("DestinationCidrBlock") == "0.0.0.0/0"
        and "NatGatewayId" in r["Properties"]
        for r in of_type(resources, "AWS::EC2::Route").values()
    )


def _endpoint_service(endpoint: dict[str, Any]) -> str:
    name = endpoint["Properties"]["ServiceName"]
    if isinstance(name, dict) and "Fn::Join" in name:
        name = "".join(p if isinstance(p, str) else "" for p in name["Fn::Join"][1])
    return str(name).rsplit(".", 1)[-1]


def _endpoint_covers(resources: Resources, service: str, subnet: str) -> bool:
    """An interface endpoint for ``service`` with private DNS and an interface in ``subnet``."""
    return any(
        e["Properties"].get("VpcEndpointType") == "Interface"
        and e["Properties"].get("PrivateDnsEnabled", False)
        and _endpoint_service(e) == service
        and subnet in [_ref(s) for s in e["Properties"].get("SubnetIds", [])]
        for e in of_type(resources, "AWS::EC2::VPCEndpoint").values()
    )


def network_path_problems(resources: Resources) -> list[str]:
    """Every mapping whose pollers could not reach what they call, or that asks for a control its
    mode lacks; empty when every path is there."""
    problems = []
    for mapping_id, mapping in sorted(of_type(resources, "AWS::Lambda::EventSourceMapping").items()):
        props = mapping["Properties"]
        source_id = _ref(props.get("EventSourceArn"))
        source = resources.get(source_id or "", {})
        if source.get("Type") not in NEEDED_SERVICES:
            continue
        provisioned = props.get("ProvisionedPollerConfig", {}).get("MinimumPollers", 0) >= 1
        kafka = source["Type"] == "AWS::MSK::Cluster"
        if kafka and "ReportBatchItemFailures" in props.get("FunctionResponseTypes", []) and not provisioned:
            problems.append(f"{mapping_id}: ReportBatchItemFailures without ProvisionedPollerConfig")
        if kafka and provisioned:
            continue  # provisioned pollers invoke from Lambda's own network
        for subnet in _source_subnets(source):
            needed = NEEDED_SERVICES[source["Type"]]
            missing = [s for s in needed if not _endpoint_covers(resources, s, subnet)]
            if missing and not _nat_routed(resources, subnet):
                problems.append(f"{mapping_id}: subnet {subnet} of {source_id} has no NAT route and no "
                                f"interface endpoint for {', '.join(missing)}")
    return problems


def test_every_event_source_mapping_can_reach_lambda_and_sts(resources: Resources) -> None:
    problems = network_path_problems(resources)
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_kafka_mapping_in_on_demand_mode(resources: Resources) -> None:
    """Without provisioned mode, the MSK mapping's isolated subnets have no way out, and its partial
    batch response has no mode that offers it: both are reported."""
    on_demand = copy.deepcopy(resources)
    for mapping in of_type(on_demand, "AWS::Lambda::EventSourceMapping").values():
        mapping["Properties"].pop("ProvisionedPollerConfig", None)
    problems = network_path_problems(on_demand)
    assert any("ReportBatchItemFailures without ProvisionedPollerConfig" in p for p in problems)
    assert any("no NAT route and no interface endpoint for lambda, sts" in p for p in problems)


def test_the_check_sees_a_broker_without_a_way_out(resources: Resources) -> None:
    """The Amazon MQ mappings pass through the NAT route of the broker's subnets: without it, they fail."""
    no_nat = copy.deepcopy(resources)
    for route_id in list(of_type(no_nat, "AWS::EC2::Route")):
        del no_nat[route_id]
    assert any("lambda, secretsmanager" in p for p in network_path_problems(no_nat))


def test_the_delay_mapping_polls_in_provisioned_mode_within_one_invocation_per_partition(
    resources: Resources,
) -> None:
    """One poller at least (always on: the mode's cost), and no more than the topic's partitions can
    keep busy (a Kafka poller drives up to 5 invocations; the Postgres budget counts one per partition)."""
    kafka = [m["Properties"] for m in of_type(resources, "AWS::Lambda::EventSourceMapping").values()
             if "Topics" in m["Properties"]]
    assert len(kafka) == 2  # the delay input's and the scheduled-call relay's (the output topic)
    for props in kafka:
        config = props["ProvisionedPollerConfig"]
        assert (config["MinimumPollers"], config["MaximumPollers"]) == (1, 1)  # 3 partitions
