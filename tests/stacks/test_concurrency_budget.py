"""Lambda's rule that moto does not enforce: reserved concurrency must leave at least 100 executions
of the account's concurrency limit unreserved, or the deploy fails on the function that crosses it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stacks import constants
from stacks.config import ConfigError
from tests.stacks.conftest import synth

pytestmark = pytest.mark.slow

Resources = dict[str, dict[str, Any]]
CTX_CONCURRENCY = constants.CTX_CONCURRENCY


def reserved_total(resources: Resources) -> int:
    return sum(
        r["Properties"].get("ReservedConcurrentExecutions", 0)
        for r in resources.values()
        if r["Type"] == "AWS::Lambda::Function"
    )


def test_default_reservations_fit_the_default_account_limit(
    resources: Resources, synthesized: tuple[Any, Path, Any]
) -> None:
    stack = synthesized[2]
    total = reserved_total(resources)
    limit = stack.config.concurrency.account_limit
    assert limit == 1000  # Lambda's default concurrency quota
    assert 0 < total <= limit - 100
    # reconcile 1 per pool, fire 2, sweep 2, bus housekeeping 1, the pending node API 100, the bus API
    # 100 (the README says the same)
    assert total == (1 * len(stack.config.pools) + 2 + 2 + 1 + constants.PENDING_API_RESERVED_CONCURRENCY
                     + constants.BUS_API_RESERVED_CONCURRENCY)


def test_reservations_are_context_settings(layer_dir: str, tmp_path: Path) -> None:
    context = {CTX_CONCURRENCY: {"fire": 3, "sweep": 1, "pendingApi": 20, "accountLimit": 300}}
    template = synth(layer_dir, tmp_path, **context)[0]
    resources = template.to_json()["Resources"]
    by_handler = {
        r["Properties"]["Handler"].split(".")[0]: r["Properties"].get("ReservedConcurrentExecutions")
        for r in resources.values()
        if r["Type"] == "AWS::Lambda::Function" and "Handler" in r["Properties"]
    }
    assert (by_handler["delay_fire"], by_handler["delay_sweep"], by_handler["pending_api"]) == (3, 1, 20)
    assert reserved_total(resources) == 1 + 3 + 1 + 1 + 20 + constants.BUS_API_RESERVED_CONCURRENCY


@pytest.mark.parametrize("limit", [10, 205])
def test_reservations_beyond_the_account_budget_fail_synth_with_the_reason(
    layer_dir: str, tmp_path: Path, limit: int
) -> None:
    reserved = 6 + constants.PENDING_API_RESERVED_CONCURRENCY + constants.BUS_API_RESERVED_CONCURRENCY
    reason = rf"(?s)reserve {reserved} .*at least 100 unreserved.*{CTX_CONCURRENCY}"
    with pytest.raises(ConfigError, match=reason):
        synth(layer_dir, tmp_path, **{CTX_CONCURRENCY: {"accountLimit": limit}})


def test_the_limit_read_from_the_account_wins_and_fails_synth_when_the_stack_does_not_fit(
    layer_dir: str, tmp_path: Path
) -> None:
    """A new account at 50 (a real quota of new accounts) with the default accountLimit of 1,000:
    the limit ./dev deploy read refuses the stack before anything is created."""
    reason = r"(?s)the account's limit, 50 \(lambda get-account-settings, read by ./dev deploy\).*at most 0"
    with pytest.raises(ConfigError, match=reason):
        synth(layer_dir, tmp_path, **{constants.CTX_ACCOUNT_CONCURRENCY: "50"})
