"""A pool's ``minSpares`` (issue 40): the stack takes it per pool and hands it to the pool's control
plane as ``SWITCHYARD_RPC_MIN_SPARES``; a negative count fails synth naming the key."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App, Stack

from stacks import constants
from stacks.config import ConfigError, DeploymentConfig
from switchyard.aws import cost
from switchyard.core.aws_secrets import source_variable
from switchyard.core.config import REDIS_URL
from switchyard.rpc.drivers.ecs import TAG_POOL
from switchyard.rpc.settings import MIN_SPARES
from tests.stacks.conftest import synth
from tests.stacks.test_switchyard_stack import one_function, policy_statements

pytestmark = pytest.mark.slow


def test_min_spares_reaches_the_pools_control_plane(layer_dir: str,
                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    pools = json.dumps([{"name": constants.EXAMPLE_POOL, "minSpares": 2}])
    template, _, _ = synth(layer_dir, tmp_path_factory.mktemp("cdk.out.spares"),
                           **{constants.CTX_POOLS: pools})
    resources = template.to_json()["Resources"]
    _, orphans = one_function(resources, "rpc_orphans")
    assert orphans["Properties"]["Environment"]["Variables"][MIN_SPARES.name] == "2"
    # A start adopts a running spare task and tags it the group's: only tasks of that pool.
    statements = policy_statements(resources, orphans)
    on_pool = f"aws:ResourceTag/{TAG_POOL}"
    adopt = [s["Condition"]["StringEquals"][on_pool] for s in statements if s["Action"] == "ecs:TagResource"
             and on_pool in s.get("Condition", {}).get("StringEquals", {})]
    assert adopt == [constants.EXAMPLE_POOL]
    # Its spare tasks register and wait in Redis: the URL, the AUTH token injected, the port open.
    family = f"{constants.WORKER_FAMILY_SUFFIX}{constants.EXAMPLE_POOL}"
    (task,) = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::ECS::TaskDefinition"
               and r["Properties"]["Family"].endswith(family)]
    (container,) = task["ContainerDefinitions"]
    assert REDIS_URL.name in {e["Name"] for e in container["Environment"]}
    assert source_variable("REDIS", "password") in {e["Name"] for e in container["Secrets"]}
    ingress = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::EC2::SecurityGroupIngress"
               and r["Properties"].get("FromPort") == constants.REDIS_PORT]
    assert any("spare workers" in rule.get("Description", "") for rule in ingress)
    # Two idle spares of 0.25 vCPU / 0.5 GB on demand, a month: the cost table's row.
    (row,) = [line for line in cost.monthly(resources) if line.item == "Fargate, RPC spares"]
    hourly = 0.25 * cost.FARGATE_VCPU_HOURLY + 0.5 * cost.FARGATE_GB_HOURLY
    assert row.usd == pytest.approx(2 * hourly * 730)
    assert "2 spares" in row.runs


def test_min_spares_defaults_to_none_and_refuses_a_negative_count() -> None:
    def config(pools: list[dict]) -> DeploymentConfig:
        return DeploymentConfig.from_context(Stack(App(context={constants.CTX_POOLS: pools})))

    assert config([{"name": "a"}]).pools[0].min_spares == 0
    with pytest.raises(ConfigError, match="minSpares must be 0 or more"):
        config([{"name": "a", "minSpares": -1}])
