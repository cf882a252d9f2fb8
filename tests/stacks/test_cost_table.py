"""The cost table of docs/deployment.md counts what the synthesized template holds: its counted
items are generated here from the template, so the table cannot drift from the stack (it had: 12
secrets for 13, 33 alarms for 36), and the MSK mappings' event pollers, billed per event poller
unit-hour in provisioned mode, are counted like the rest. The cluster forms' rows count the broker's
instances and ElastiCache's nodes (shards x (1 + replicas)) of the default template and of the
cluster forms' (``cluster_forms`` in conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from scripts import costs
from stacks import constants
from switchyard.aws.cost import Line, as_json, load_resources, monthly, total
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


# -- each choice of parts and size (issue 37): switchyard/aws/cost.py prices its synthesized template --
def _priced(name: str, variants: Callable[[str], tuple[Template, Path, Any]]) -> list[Line]:
    """What ``switchyard cost`` reads: the variant's cloud assembly, its pools' nested templates too."""
    _, outdir, stack = variants(name)
    return monthly(load_resources(outdir, stack.artifact_id))


def test_the_pages_price_each_choice_as_its_template_does(
        variants: Callable[[str], tuple[Template, Path, Any]]) -> None:
    priced = {name: _priced(name, variants) for name in costs.VARIANTS}
    for path, render in ((DOC, costs.render), (ROOT / costs.README, costs.render_readme)):
        page = path.read_text()
        assert page == render(page, priced), f"{path.name}'s table of choices: python -m scripts.costs docs"


@pytest.mark.parametrize("name", list(costs.VARIANTS))
def test_each_choice_is_priced_from_what_it_runs(
        name: str, variants: Callable[[str], tuple[Template, Path, Any]]) -> None:
    """Every always-on service of the template is a line, counted as the template holds it (the
    counts of the default table's first line, on each variant)."""
    template, _, _ = variants(name)
    resources = template.to_json()["Resources"]
    lines = {line.item: line for line in _priced(name, variants)}
    n = counted(resources)
    services = {"AWS::AmazonMQ::Broker": "Amazon MQ", "AWS::MSK::Cluster": "MSK", "AWS::RDS::DBInstance":
                "RDS Postgres", "AWS::ElastiCache::ReplicationGroup": "ElastiCache",
                "AWS::EC2::NatGateway": "NAT gateway", "AWS::ECS::Service": "Fargate, bus workers"}
    for kind, item in services.items():
        assert (item in lines) == bool(_of(resources, kind)), f"{name}: {item}"
        if item in lines:
            assert lines[item].usd > 0 and lines[item].source.startswith("aws.amazon.com/"), lines[item]
    assert lines["CloudWatch"].runs.startswith(f"{plural(n['alarms'], 'alarm')} ")
    secrets = f"{plural(n['secrets'], 'secret')}, {plural(n['keys'], 'key')}"
    assert lines["Secrets Manager, KMS"].runs == secrets
    if n["nat"]:
        assert lines["NAT gateway"].runs.startswith(f"{n['nat']}, ")
    assert abs(total(lines.values()) - sum(line.usd for line in lines.values())) < 0.01


def test_the_cli_prints_the_figure_of_a_synthesized_stack(
        variants: Callable[[str], tuple[Template, Path, Any]]) -> None:
    _, outdir, stack = variants("rpc-dev")
    done = subprocess.run([sys.executable, "-m", "switchyard", "cost", "--assembly", str(outdir),
                           "--stack-name", stack.artifact_id, "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == as_json(_priced("rpc-dev", variants))
    missing = subprocess.run([sys.executable, "-m", "switchyard", "cost", "--assembly",
                              str(outdir / "nope")], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1, missing.stderr
    assert "run ./dev cdk synth" in missing.stderr


def test_dev_costs_less_than_production_and_a_part_less_than_all(
        variants: Callable[[str], tuple[Template, Path, Any]]) -> None:
    month = {name: total(_priced(name, variants)) for name in costs.VARIANTS}
    assert month["all-dev"] < month["all-production"]
    assert max(month[f"{part}-dev"] for part in ("rpc", "delay", "bus", "pending")) < month["all-dev"]
