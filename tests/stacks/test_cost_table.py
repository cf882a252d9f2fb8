"""The cost table of docs/deployment.md counts what the synthesized template holds: its counted
items are generated here from the template, so the table cannot drift from the stack (it had: 12
secrets for 13, 33 alarms for 36), and the MSK mappings' event pollers, billed per event poller
unit-hour in provisioned mode, are counted like the rest. The cluster forms' rows count the broker's
instances and ElastiCache's nodes (shards x (1 + replicas)) of the default template and of the
cluster forms' (``cluster_forms`` in conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk.assertions import Template

from stacks import constants
from tests.conftest import ROOT

HOURS = 730  # a month, as the table prices it
DOC = ROOT / "docs" / "deployment.md"
# A month of each instance type the two templates run, as the table prices them (on-demand, us-east-1;
# aws.amazon.com/amazon-mq/pricing, aws.amazon.com/elasticache/pricing: a Valkey node).
MONTHLY_USD = {"mq.m7g.large": 200, "cache.t4g.micro": 10}


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _of(resources: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r.get("Properties", {}) for r in resources.values() if r["Type"] == kind]


def counted(resources: dict[str, Any]) -> dict[str, int]:
    pollers = [m["ProvisionedPollerConfig"] for m in _of(resources, "AWS::Lambda::EventSourceMapping")
               if "ProvisionedPollerConfig" in m]
    return {
        "secrets": len(_of(resources, "AWS::SecretsManager::Secret")),
        "keys": len(_of(resources, "AWS::KMS::Key")),
        "alarms": len(_of(resources, "AWS::CloudWatch::Alarm")),
        "nat": len(_of(resources, "AWS::EC2::NatGateway")),
        "eips": len(_of(resources, "AWS::EC2::EIP")),
        "bus_tasks": sum(int(s.get("DesiredCount", 1)) for s in _of(resources, "AWS::ECS::Service")),
        "mappings": len(pollers),
        "groups": len({str(p.get("PollerGroupName", i)) for i, p in enumerate(pollers)}),
        "min_pollers": sum(int(p.get("MinimumPollers", 1)) for p in pollers),
    }


def sentence(n: dict[str, int]) -> str:
    """The table's first line, as the template gives it."""
    ips = "with its Elastic IP" if n["nat"] == n["eips"] == 1 else f"and {plural(n['eips'], 'Elastic IP')}"
    group = "one poller group" if n["groups"] == 1 else plural(n["groups"], "poller group")
    return (f"Counted from the synthesized template ({plural(n['secrets'], 'secret')}, "
            f"{plural(n['keys'], 'KMS key')}, {plural(n['alarms'], 'alarm')}, "
            f"{plural(n['nat'], 'NAT gateway')} {ips}, {plural(n['bus_tasks'], 'bus worker task')}, "
            f"{plural(n['mappings'], 'MSK mapping')} in provisioned mode in {group}, "
            f"{plural(n['min_pollers'], 'event poller')} minimum: at most "
            f"{n['min_pollers'] * HOURS:,} event poller unit-hours a month idle)")


def form_rows(resources: dict[str, Any]) -> list[str]:
    """The cluster forms table's rows: the broker's instances and ElastiCache's nodes, priced."""
    (broker,) = _of(resources, "AWS::AmazonMQ::Broker")
    (group,) = _of(resources, "AWS::ElastiCache::ReplicationGroup")
    mode, mq_type, node_type = broker["DeploymentMode"], broker["HostInstanceType"], group["CacheNodeType"]
    instances = constants.BROKER_INSTANCES[mode]
    shards = int(group.get("NumNodeGroups", 1))
    replicas = int(group.get("ReplicasPerNodeGroup", int(group.get("NumCacheClusters", 1)) - 1))
    nodes = shards * (1 + replicas)
    shape = f"{plural(shards, 'shard')} x (1 + {plural(replicas, 'replica')})"
    cluster = "on" if "NumNodeGroups" in group else "off"
    return [
        f"| Amazon MQ, `{mode}` | {instances} x `{mq_type}` | ${instances * MONTHLY_USD[mq_type]:,} |",
        f"| ElastiCache, cluster mode {cluster}: {shape} | {nodes} x `{node_type}` "
        f"| ${nodes * MONTHLY_USD[node_type]:,} |",
    ]


def test_the_cluster_forms_rows_price_what_each_template_runs(
        resources: dict[str, Any], cluster_forms: tuple[Template, Path, Any]) -> None:
    rows = form_rows(resources) + form_rows(cluster_forms[0].to_json()["Resources"])
    text = " ".join(DOC.read_text().split())
    missing = [row for row in rows if row not in text]
    assert missing == [], "docs/deployment.md's cluster forms table: write its rows as\n" + "\n".join(rows)


def test_the_cost_table_counts_what_the_template_holds(resources: dict[str, Any]) -> None:
    n = counted(resources)
    text = " ".join(DOC.read_text().split())
    expected = sentence(n)
    assert expected in text, f"docs/deployment.md's cost table: write its first line as\n{expected}"
    rows = {f"| CloudWatch | {n['alarms']} alarms,", f"| Secrets Manager, KMS | {n['secrets']} secrets ",
            f"| MSK event poller | provisioned mode, {n['mappings']} mappings"}
    assert [row for row in rows if row not in text] == []


def test_the_msk_mappings_share_one_poller_group(resources: dict[str, Any]) -> None:
    n = counted(resources)
    assert n["mappings"] == 2 and n["groups"] == 1, n
