"""How many pools one stack holds: CloudFormation takes at most 500 resources per stack. Each pool's
own resources are in a nested stack of its own (stacks/pool_stacks.py); what a pool adds to the
parent is its nested stack and its broker user secrets. Twenty pools synthesize (the parent at about
400 resources, each pool's template at a few dozen), and past the limit computed from the parent's
count synth says how many pools fit and what to do, instead of CloudFormation's bare
``TooManyResourcesInStack``. The pools custom resource reads every pool's broker user secrets with
one statement (their names share the stack's prefix), so its policy does not grow past IAM's inline
size into managed policies that CDK would add at synth, uncounted by the limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from stacks import constants
from stacks.application import build_app
from stacks.config import ConfigError
from stacks.pool_stacks import pool_stacks
from tests.stacks.conftest import synth

pytestmark = pytest.mark.slow


def _pools(count: int) -> dict[str, str]:
    return {constants.CTX_POOLS: json.dumps([{"name": f"pool{i}"} for i in range(count)])}


def _counts(stack: Any) -> list[int]:
    """Resources of the parent's template, then of each pool's nested template, as synthesized."""
    return [len(Template.from_stack(s).to_json()["Resources"]) for s in (stack, *pool_stacks(stack))]


@pytest.fixture(scope="module")
def one_and_two(layer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    return tuple(synth(layer_dir, tmp_path_factory.mktemp(f"cdk.out.{n}"), **_pools(n))[2]  # type: ignore[return-value]
                 for n in (1, 2))


def test_a_pool_adds_its_nested_stack_and_secrets_to_the_parent(one_and_two: tuple[Any, Any]) -> None:
    one, two = one_and_two
    assert _counts(two)[0] - _counts(one)[0] == two.pool_resources_here()
    assert len(_counts(two)) == 3 and _counts(two)[1] == _counts(two)[2] == _counts(one)[1]


def test_twenty_pools_synthesize_each_template_under_the_limit(layer_dir: str, tmp_path: Path) -> None:
    _, _, stack = synth(layer_dir, tmp_path, **_pools(20))
    parent, *pools = _counts(stack)
    print(f"20 pools: the parent holds {parent} resources, each pool's nested stack {pools[0]}")
    assert len(pools) == 20 and max(parent, *pools) < constants.CFN_MAX_RESOURCES


def test_past_the_limit_synth_names_how_many_pools_fit(layer_dir: str, tmp_path: Path,
                                                      one_and_two: tuple[Any, Any]) -> None:
    one, two = one_and_two
    per_pool = _counts(two)[0] - _counts(one)[0]
    fit = (constants.CFN_MAX_RESOURCES - (_counts(one)[0] - per_pool)) // per_pool
    assert fit >= 30, f"one stack holds {fit} pools"
    message = (rf"{fit + 1} pools make \d+ resources in this stack, over CloudFormation's 500: "
               rf".* at most {fit} pools")
    with pytest.raises(ConfigError, match=message):  # raised while building, before any synth
        build_app(context={constants.CTX_LAYER_DIR: str(layer_dir), **_pools(fit + 1)}, outdir=str(tmp_path))
    # The limit is the real one: nothing synth adds (an IAM policy split in two) outgrows it.
    _, _, stack = synth(layer_dir, tmp_path / "fit", **_pools(fit))
    assert constants.CFN_MAX_RESOURCES - per_pool < _counts(stack)[0] <= constants.CFN_MAX_RESOURCES
