"""A stack's template with its pools' nested templates folded in, as the flat stack's would read: the
stack tests check what is deployed, wherever CloudFormation keeps it (stacks/pool_stacks.py).

A nested template's parameter is replaced by the value the parent passes it, a parent's ``Fn::GetAtt``
of a nested output by that output's value, and a dependency on (or of) the nested stack by one on (or
of) each of its resources: every reference then names the resource it reaches, by the logical ID it
has in its own template (the same as in a flat stack)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_cdk import Stack
from aws_cdk.assertions import Template

from stacks.pool_stacks import pool_stacks


def _rewrite(value: Any, swap: Callable[[dict[str, Any]], Any]) -> Any:
    if isinstance(value, dict):
        swapped = swap(value)
        if swapped is not value:
            return swapped
        return {k: _rewrite(v, swap) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite(v, swap) for v in value]
    return value


def _depends(resource: dict[str, Any]) -> list[str]:
    on = resource.get("DependsOn", [])
    return [on] if isinstance(on, str) else list(on)


def merged_template(stack: Stack) -> dict[str, Any]:
    """``stack``'s template with each pool's nested template's resources in it, references resolved."""
    body = Template.from_stack(stack).to_json()
    resources = body["Resources"]
    for nested in pool_stacks(stack):
        inner = Template.from_stack(nested).to_json()
        nested_id = stack.get_logical_id(nested.nested_stack_resource)  # type: ignore[arg-type]
        holder = resources.pop(nested_id)
        params = holder["Properties"].get("Parameters", {})
        outputs = {f"Outputs.{name}": out["Value"] for name, out in inner.get("Outputs", {}).items()}

        def from_parent(node: dict[str, Any], params: dict[str, Any] = params) -> Any:
            ref = node.get("Ref")
            return params[ref] if len(node) == 1 and isinstance(ref, str) and ref in params else node

        def from_nested(node: dict[str, Any], nested_id: str = nested_id,
                        outputs: dict[str, Any] = outputs) -> Any:
            att = node.get("Fn::GetAtt")
            if len(node) == 1 and isinstance(att, list) and att[0] == nested_id:
                return outputs[att[1]]
            return node

        added = {}
        for logical, resource in inner["Resources"].items():
            assert logical not in resources, f"{logical} is in the parent and in {nested.node.id}"
            resource = _rewrite(resource, from_parent)
            after = _depends(resource) + _depends(holder)
            if after:
                resource["DependsOn"] = sorted(set(after))
            added[logical] = resource
        for logical, resource in list(resources.items()):
            resource = _rewrite(resource, from_nested)
            if nested_id in _depends(resource):
                resource["DependsOn"] = sorted(
                    {*(d for d in _depends(resource) if d != nested_id), *added})
            resources[logical] = resource
        resources.update(added)
        body["Outputs"] = _rewrite(body.get("Outputs", {}), from_nested)
    return body


def template_of(stack: Stack) -> Template:
    """``merged_template`` as an assertions ``Template``."""
    return Template.from_json(merged_template(stack))
