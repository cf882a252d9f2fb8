"""How many pools one stack holds: CloudFormation takes at most 500 resources per stack, and each
pool adds RESOURCES_PER_POOL of them. Past the limit synth says how many pools fit and what to do,
instead of CloudFormation's bare ``TooManyResourcesInStack`` (or, before synth checked, a failed
deploy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stacks import constants as c
from stacks.config import ConfigError
from tests.stacks.conftest import synth

pytestmark = pytest.mark.slow


def _pools(count: int) -> dict[str, str]:
    return {c.CTX_POOLS: json.dumps([{"name": f"pool{i}"} for i in range(count)])}


def test_a_pool_adds_the_resources_the_limit_is_computed_with(layer_dir: str, tmp_path: Path,
                                                              resources: dict[str, Any]) -> None:
    two = synth(layer_dir, tmp_path, **_pools(2))[0].to_json()["Resources"]
    one = synth(layer_dir, tmp_path / "one", **_pools(1))[0].to_json()["Resources"]
    assert len(two) - len(one) == c.RESOURCES_PER_POOL


def test_past_the_limit_synth_names_how_many_pools_fit(layer_dir: str, tmp_path: Path) -> None:
    fit = r"6 pools make \d+ resources in this stack, over CloudFormation's 500: .* at most 5 pools"
    with pytest.raises(ConfigError, match=fit):
        synth(layer_dir, tmp_path, **_pools(6))
