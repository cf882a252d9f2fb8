"""A new key's first call on AWS is answered, not expired (issue 22, item 11).

The first request to a key waits, under its expiration (the call's timeout), for the orphan event
source, the orphan handler, RunTask and a Fargate task's start (AWS: 30-45 seconds or longer, the
image pull included): the deployment's default timeout must outlive that, for every process that
reads the stack's configuration and for the workers themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_cdk import App, Stack

from stacks import constants
from stacks.config import ConfigError, DeploymentConfig
from switchyard.core import deployed_config
from switchyard.core.deployed_config import CONFIG_PATH_ENV, config_path
from switchyard.rpc.settings import CALL_TIMEOUT_ENV, PoolPolicy, RpcSettings
from tests.conftest import unique
from tests.stacks.conftest import synth

MOTO = "http://127.0.0.1:5000"
Resources = dict[str, dict[str, Any]]


def config(**context: Any) -> DeploymentConfig:
    return DeploymentConfig.from_context(Stack(App(context=context)))


def deployed_call_timeout(resources: Resources) -> float:
    """What a process reading the stack's configuration uses as its calls' default timeout."""
    for r in resources.values():
        if r["Type"] == "AWS::SSM::Parameter" and r["Properties"]["Name"].endswith(f"/{CALL_TIMEOUT_ENV}"):
            return float(r["Properties"]["Value"])
    return RpcSettings().call_timeout  # not deployed: the library's default


@pytest.mark.slow
def test_the_deployed_call_timeout_outlives_a_new_keys_first_call(
    resources: Resources, synthesized: tuple[Any, Path, Any]
) -> None:
    stack_config: DeploymentConfig = synthesized[2].config
    timeout = deployed_call_timeout(resources)
    for pool in stack_config.pools:
        assert timeout >= pool.first_call_s, (pool.name, timeout, pool.first_call_s)
    assert pool.first_call_s >= constants.FARGATE_TASK_START_S + pool.batch_window_seconds
    assert timeout <= PoolPolicy().message_ttl_ms / 1000  # the queues' own TTL would cut it short


@pytest.mark.slow
def test_workers_calling_other_pools_get_the_same_default(resources: Resources) -> None:
    timeout = deployed_call_timeout(resources)
    workers = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::ECS::TaskDefinition"
               and r["Properties"]["Family"].startswith(
                   f"{constants.STACK_ID}-{constants.WORKER_FAMILY_SUFFIX}")]
    assert workers
    for task in workers:
        (container,) = task["ContainerDefinitions"]
        env = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert float(env[CALL_TIMEOUT_ENV]) == timeout


@pytest.mark.slow
def test_the_call_timeout_is_a_context_setting(layer_dir: str, tmp_path: Path) -> None:
    resources = synth(layer_dir, tmp_path, **{constants.CTX_CALL_TIMEOUT: 180})[0].to_json()["Resources"]
    assert deployed_call_timeout(resources) == 180


@pytest.mark.parametrize(("context", "message"), [
    ({constants.CTX_CALL_TIMEOUT: 30}, r"30 s.*new key's first call.*'core'.*Fargate"),
    ({constants.CTX_POOLS: [{"name": "slow", "batchWindowSeconds": 120}]}, r"'slow'.*batchWindowSeconds 120"),
    ({constants.CTX_CALL_TIMEOUT: 400}, r"longer than the request queues' TTL"),
])
def test_a_call_timeout_a_first_call_cannot_meet_fails_synth(context: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(**context)


@pytest.fixture
def stack_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A deployed stack's configuration path on moto, the process pointed at it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", MOTO)
    monkeypatch.setenv(CALL_TIMEOUT_ENV, "recorded")  # so the value the configuration sets is undone
    monkeypatch.delenv(CALL_TIMEOUT_ENV)
    path = config_path(unique("Stack").replace("_", "-"))
    monkeypatch.setenv(CONFIG_PATH_ENV, path)
    deployed_config.forget()
    yield path
    ssm = boto3.client("ssm", endpoint_url=MOTO)
    for page in ssm.get_paginator("get_parameters_by_path").paginate(Path=path):
        for parameter in page["Parameters"]:
            ssm.delete_parameter(Name=parameter["Name"])
    deployed_config.forget()


def test_a_process_reading_the_stack_gets_its_call_timeout(stack_path: str) -> None:
    ssm = boto3.client("ssm", endpoint_url=MOTO)
    ssm.put_parameter(Name=f"{stack_path}{CALL_TIMEOUT_ENV}", Value="120", Type="String")
    assert RpcSettings.from_env().call_timeout == 120
