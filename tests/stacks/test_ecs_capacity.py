"""ECS's capacity rule, which moto does not enforce: RunTask's ``capacityProviderStrategy`` may only
name capacity providers associated with the cluster (ECS answers ``InvalidParameterException``).

The driver's RunTask is run here with each pool's environment from the synthesized template, against
a recording client, and what it sends is checked against the cluster's associations in the template.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from stacks import constants
from stacks.config import ConfigError
from switchyard.rpc.drivers import WorkerGroup, driver_from_env
from switchyard.rpc.drivers import ecs as ecs_driver
from tests.stacks.conftest import synth

pytestmark = pytest.mark.slow

Resources = dict[str, dict[str, Any]]


class RecordingEcs:
    """An ECS client that finds no task and records every RunTask (nothing reaches AWS or moto)."""

    def __init__(self) -> None:
        self.run_task_calls: list[dict[str, Any]] = []

    def get_paginator(self, _operation: str) -> Any:
        class Pages:
            @staticmethod
            def paginate(**_kwargs: Any) -> list[dict[str, Any]]:
                return [{"taskArns": []}]
        return Pages()

    def describe_tasks(self, **_kwargs: Any) -> dict[str, Any]:
        return {"tasks": []}

    def run_task(self, **kwargs: Any) -> dict[str, Any]:
        self.run_task_calls.append(kwargs)
        return {"tasks": [{"taskArn": "arn:aws:ecs:us-east-1:123456789012:task/c/1"}], "failures": []}


def cluster_capacity_providers(resources: Resources) -> dict[str, set[str]]:
    """Cluster logical id -> the capacity providers associated with it."""
    found: dict[str, set[str]] = {k: set() for k, r in resources.items() if r["Type"] == "AWS::ECS::Cluster"}
    for r in resources.values():
        if r["Type"] == "AWS::ECS::ClusterCapacityProviderAssociations":
            found[r["Properties"]["Cluster"]["Ref"]].update(r["Properties"]["CapacityProviders"])
    return found


def control_plane_env(resources: Resources) -> dict[str, dict[str, Any]]:
    """Logical id -> environment of every function that runs the ECS driver."""
    return {
        k: r["Properties"]["Environment"]["Variables"]
        for k, r in resources.items()
        if r["Type"] == "AWS::Lambda::Function"
        and r["Properties"].get("Environment", {}).get("Variables", {}).get("SWITCHYARD_RPC_DRIVER") == "ecs"
    }


def run_task_as_deployed(env: dict[str, Any], pool: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The RunTask request the driver built from ``env`` (a function's environment) sends."""
    for name, value in env.items():
        if name.startswith("SWITCHYARD_RPC_ECS_") or name in ("SWITCHYARD_RPC_DRIVER",
                                                              "SWITCHYARD_RPC_MIN_WORKERS"):
            monkeypatch.setenv(name, value if isinstance(value, str) else "deploy-time-token")
    monkeypatch.delenv("SWITCHYARD_CONFIG_PATH", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    driver = driver_from_env()
    recorder = RecordingEcs()
    driver.client, driver.lock = recorder, lambda _group: contextlib.nullcontext()  # type: ignore[attr-defined]
    driver.start(WorkerGroup(pool, "first-key"))
    (call,) = recorder.run_task_calls
    return call


def test_runtask_names_only_capacity_providers_of_the_cluster(
    resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    associated = cluster_capacity_providers(resources)
    (cluster,) = [k for k in associated if k.startswith(constants.WORKERS_CONSTRUCT_ID)]
    envs = control_plane_env(resources)
    assert envs
    for logical, env in envs.items():
        assert env["SWITCHYARD_RPC_ECS_CLUSTER"] == {"Ref": cluster}, logical
        call = run_task_as_deployed(env, constants.EXAMPLE_POOL, monkeypatch)
        assert "launchType" not in call  # ECS refuses a launch type together with a strategy
        named = {s["capacityProvider"] for s in call["capacityProviderStrategy"]}
        assert named <= associated[cluster], (
            f"{logical}: RunTask names {sorted(named)}, the cluster has {sorted(associated[cluster])}")


def test_every_capacity_provider_the_driver_can_name_is_associated(resources: Resources) -> None:
    associated = cluster_capacity_providers(resources)
    (cluster,) = [k for k in associated if k.startswith(constants.WORKERS_CONSTRUCT_ID)]
    assert set(ecs_driver.CAPACITY_PROVIDERS) <= associated[cluster]
    assert ecs_driver.DEFAULT_CAPACITY_PROVIDER in ecs_driver.CAPACITY_PROVIDERS


def test_the_capacity_provider_is_a_pool_setting_with_fargate_the_default(
    layer_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools = [{"name": "core"}, {"name": "batch", "capacityProvider": "FARGATE_SPOT"}]
    template: Template = synth(layer_dir, tmp_path, **{constants.CTX_POOLS: pools})[0]
    resources = template.to_json()["Resources"]
    sent = {}
    for env in control_plane_env(resources).values():
        pool = env["SWITCHYARD_RPC_POOL"]
        call = run_task_as_deployed(env, pool, monkeypatch)
        sent.setdefault(pool, set()).update(s["capacityProvider"] for s in call["capacityProviderStrategy"])
    assert sent == {"core": {"FARGATE"}, "batch": {"FARGATE_SPOT"}}


def test_an_unknown_capacity_provider_fails_synth(layer_dir: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="capacityProvider"):
        synth(layer_dir, tmp_path, **{constants.CTX_POOLS: [{"name": "core", "capacityProvider": "EC2"}]})
