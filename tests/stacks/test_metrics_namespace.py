"""Two stacks in one account (staging beside production) keep their metrics apart end to end.

Both emit the same metric names with the same dimensions, so each stack has its own CloudWatch
namespace: its functions and ECS tasks emit there (Powertools' namespace variable), its deployed
configuration names it (the local runtime's shipper, ``switchyard --stack``), and its alarms and
dashboard read it and no other Switchyard namespace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from aws_cdk import Stack

from switchyard.core.deployed_config import (
    DEFAULT_METRICS_NAMESPACE,
    METRICS_NAMESPACE_ENV,
    metrics_namespace,
)
from tests.stacks.nested import merged_template

pytestmark = pytest.mark.slow

# A whole (JSON-quoted, maybe escaped) string that is a Switchyard namespace.
OURS = re.compile(rf'\\*"({DEFAULT_METRICS_NAMESPACE}(?:/[A-Za-z0-9-]+)?)\\*"')
AWS_OWN = ("AWS/", "ECS/")  # AWS's own metrics: their dimensions name this stack's resources


def _namespaces(node: Any) -> Iterator[str]:
    """Every namespace an alarm's metrics or expressions read."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "Namespace" and isinstance(value, str):
                yield value
            elif key == "Expression" and isinstance(value, str):
                yield from re.findall(r'SCHEMA\("([^"]+)"', value)
            else:
                yield from _namespaces(value)
    elif isinstance(node, list):
        for item in node:
            yield from _namespaces(item)


def _of_kind(template: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r["Properties"] for r in template["Resources"].values() if r["Type"] == kind]


def test_each_stack_emits_and_alarms_in_its_own_namespace(two_stacks: list[Stack]) -> None:
    names = [metrics_namespace(s.stack_name) for s in two_stacks]
    assert len(set(names)) == 2
    for stack, own in zip(two_stacks, names, strict=True):
        template = merged_template(stack)
        alarms = _of_kind(template, "AWS::CloudWatch::Alarm")
        read = [ns for alarm in alarms for ns in _namespaces(alarm)]
        assert own in read, f"{stack.stack_name}: no alarm reads its own metrics"
        assert {ns for ns in read if not ns.startswith(AWS_OWN)} == {own}, stack.stack_name
        emitters = [(fn.get("Environment", {}).get("Variables", {}), "function")
                    for fn in _of_kind(template, "AWS::Lambda::Function")]
        emitters += [({e["Name"]: e["Value"] for e in c.get("Environment", [])}, "task")
                     for task in _of_kind(template, "AWS::ECS::TaskDefinition")
                     for c in task["ContainerDefinitions"]]
        emitting = [env["POWERTOOLS_METRICS_NAMESPACE"] for env, _ in emitters
                    if "POWERTOOLS_METRICS_NAMESPACE" in env]
        kinds = {kind for env, kind in emitters if "POWERTOOLS_METRICS_NAMESPACE" in env}
        assert kinds == {"function", "task"}
        assert set(emitting) == {own}, stack.stack_name
        config = {p["Name"].rsplit("/", 1)[-1]: p["Value"] for p in _of_kind(template, "AWS::SSM::Parameter")
                  if isinstance(p["Name"], str)}
        assert config[METRICS_NAMESPACE_ENV] == own
        # The dashboard, and anything else in the template, names no other Switchyard namespace.
        text = json.dumps(template)
        assert set(OURS.findall(text)) == {own}, stack.stack_name
