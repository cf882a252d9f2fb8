"""The local runtime configured from the deployed stack, its metrics evaluated by the deployed alarms.

LocalStack serves SSM, Secrets Manager and CloudWatch; moto serves what LocalStack lacks (ECS,
EMR Serverless) through boto3's per-service endpoints, in the same process.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import boto3
import pika
import pika.exceptions
import pytest

from scripts.localstack_deploy import Deployment
from tests.conftest import ROOT, subprocess_env

MOTO = "http://127.0.0.1:5000"
LOCAL_BROKER = "amqp://guest:guest@127.0.0.1:5672/%2F"  # the stack's broker (test_config_comes_from...)
WATCHED = ("core-poison-growing", "delay-messages-overdue")  # alarm names after the stack's name


def stack_env(deployment: Deployment) -> dict[str, str]:
    """A child's environment: LocalStack for everything, moto for ECS and EMR Serverless."""
    return subprocess_env(AWS_ENDPOINT_URL=deployment.endpoint, AWS_ENDPOINT_URL_ECS=MOTO,
                          AWS_ENDPOINT_URL_EMR_SERVERLESS=MOTO, SWITCHYARD_LOG_LEVEL="ERROR")


def switchyard(deployment: Deployment, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "switchyard", "--stack", deployment.stack_name, *args],
                          cwd=ROOT, env=stack_env(deployment), capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_config_comes_from_the_deployed_stack(localstack_deployment: Deployment) -> None:
    """``switchyard --stack`` reads the parameters and fills the broker password from the secret."""
    done = switchyard(localstack_deployment, "config", timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"SSM {localstack_deployment.outputs['ConfigPath']}" in done.stdout
    assert "amqp://guest:***@127.0.0.1:5672/%2F" in done.stdout  # {username}:{password} filled


def test_per_service_endpoints_split_localstack_and_moto(localstack_deployment: Deployment,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in stack_env(localstack_deployment).items():
        if name.startswith("AWS_ENDPOINT_URL"):
            monkeypatch.setenv(name, value)
    ssm: Any = boto3.client("ssm")
    path = localstack_deployment.outputs["ConfigPath"]
    assert ssm.get_parameters_by_path(Path=path)["Parameters"]  # LocalStack: the deployed stack
    ecs: Any = boto3.client("ecs")
    assert ecs.meta.endpoint_url == MOTO
    cluster = ecs.create_cluster(clusterName="switchyard-endpoint-check")["cluster"]["clusterArn"]
    try:
        assert cluster in ecs.list_clusters()["clusterArns"]
    finally:
        ecs.delete_cluster(cluster=cluster)
    assert boto3.client("emr-serverless").meta.endpoint_url == MOTO


def queue_depth(queue: str) -> int | None:
    """Messages in ``queue`` on the stack's broker (the local RabbitMQ), None if there is no such queue."""
    connection = pika.BlockingConnection(pika.URLParameters(LOCAL_BROKER))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return None
    finally:
        connection.close()


@pytest.mark.slow
def test_alarm_scenario_trips_and_clears_the_watched_alarms(localstack_deployment: Deployment) -> None:
    """Poison and an overdue backlog trip their alarms; calm traffic does not; both clear after. The
    run uses keys of its own and leaves nothing behind: no request queue, no poison in the inventory."""
    poisoned_before = queue_depth("core-poison") or 0
    done = switchyard(localstack_deployment, "alarms", "scenario", "--timeout", "120", timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    keys = re.findall(r"^run \S+: keys (\S+) and (\S+)$", done.stdout, re.MULTILINE)
    assert len(keys) == 1 and not {"calm", "poison"} & set(keys[0]), done.stdout[:500]
    for key in keys[0]:
        assert queue_depth(f"core-req-{key}") is None, key
    assert (queue_depth("core-poison") or 0) == poisoned_before
    rows = {line.split()[1]: line.split()[2:] for line in done.stdout.splitlines()
            if line.startswith("* ")}
    watched = [f"{localstack_deployment.stack_name}-{name}" for name in WATCHED]
    assert set(rows) == set(watched)
    for name in watched:
        _before, calm, tripped, _recovered = rows[name]
        assert calm != "ALARM" and tripped == "ALARM", (name, rows[name])
    assert rows[watched[1]][-1] == "OK"  # recovered: the backlog fired (delay-messages-overdue)
    assert "0 malformed, 0 datums dropped" in done.stdout
