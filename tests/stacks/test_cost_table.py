"""The cost table of docs/deployment.md counts what the synthesized template holds: its counted
items are generated here from the template, so the table cannot drift from the stack (it had: 12
secrets for 13, 33 alarms for 36), and the MSK mappings' event pollers, billed per event poller
unit-hour in provisioned mode, are counted like the rest."""

from __future__ import annotations

from typing import Any

from tests.conftest import ROOT

HOURS = 730  # a month, as the table prices it
DOC = ROOT / "docs" / "deployment.md"


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
    def plural(count: int, word: str) -> str:
        return f"{count} {word}" + ("" if count == 1 else "s")

    ips = "with its Elastic IP" if n["nat"] == n["eips"] == 1 else f"and {plural(n['eips'], 'Elastic IP')}"
    group = "one poller group" if n["groups"] == 1 else plural(n["groups"], "poller group")
    return (f"Counted from the synthesized template ({plural(n['secrets'], 'secret')}, "
            f"{plural(n['keys'], 'KMS key')}, {plural(n['alarms'], 'alarm')}, "
            f"{plural(n['nat'], 'NAT gateway')} {ips}, {plural(n['bus_tasks'], 'bus worker task')}, "
            f"{plural(n['mappings'], 'MSK mapping')} in provisioned mode in {group}, "
            f"{plural(n['min_pollers'], 'event poller')} minimum: at most "
            f"{n['min_pollers'] * HOURS:,} event poller unit-hours a month idle)")


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
