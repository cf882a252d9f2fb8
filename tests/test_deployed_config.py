"""Configuration read from a deployed stack's SSM path (moto here; LocalStack in tests/localstack)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import boto3
import pytest

from switchyard.cli import main
from switchyard.core import deployed_config
from switchyard.core.aws_secrets import SECRET_URLS, source_variables
from switchyard.core.config import Connections, config_source
from switchyard.core.deployed_config import CONFIG_PATH_ENV, config_path, deployed_values
from switchyard.core.errors import ConfigError
from tests.conftest import unique

MOTO = "http://127.0.0.1:5000"


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh parameter path on moto, with the process pointed at it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", MOTO)
    monkeypatch.setenv(CONFIG_PATH_ENV, "")  # recorded, so the value `main --stack` sets is undone
    name = unique("Stack").replace("_", "-")
    deployed_config.forget()
    yield name
    ssm = boto3.client("ssm", endpoint_url=MOTO)
    for page in ssm.get_paginator("get_parameters_by_path").paginate(Path=config_path(name)):
        for parameter in page["Parameters"]:
            ssm.delete_parameter(Name=parameter["Name"])
    deployed_config.forget()


def unset(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Unset ``names`` so that what the deployed configuration sets in their place is undone after
    the test too (``delenv`` of an unset variable records nothing to restore)."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def put(stack: str, **values: str) -> None:
    ssm = boto3.client("ssm", endpoint_url=MOTO)
    for name, value in values.items():
        ssm.put_parameter(Name=config_path(stack) + name, Value=value, Type="String", Overwrite=True)


def test_parameters_are_read_under_the_environment_and_process_overrides_win(stack: str) -> None:
    from switchyard.rpc.settings import POOL

    put(stack, SWITCHYARD_REDIS_URL="redis://10.0.0.9:6379/0", SWITCHYARD_RPC_POOL="core",
        PATH="/evil", SWITCHYARD_lower="x")
    env = {CONFIG_PATH_ENV: config_path(stack), "SWITCHYARD_RPC_POOL": "mine"}
    values = deployed_values(env)
    assert values == {"SWITCHYARD_REDIS_URL": "redis://10.0.0.9:6379/0", "SWITCHYARD_RPC_POOL": "core"}
    source = config_source(env)
    assert Connections.from_env(source).redis_url == "redis://10.0.0.9:6379/0"
    assert POOL.read(source) == "mine"  # set by the process: the override wins
    assert "SWITCHYARD_REDIS_URL" not in env  # values, never written into the environment
    assert "PATH" not in source and "SWITCHYARD_lower" not in source  # only SWITCHYARD_* names are taken


def test_cached_until_max_age_then_refreshed(stack: str) -> None:
    put(stack, SWITCHYARD_REDIS_URL="redis://a:6379/0")
    env = {CONFIG_PATH_ENV: config_path(stack), "SWITCHYARD_CONFIG_MAX_AGE_S": "300"}
    assert deployed_values(env)["SWITCHYARD_REDIS_URL"] == "redis://a:6379/0"
    put(stack, SWITCHYARD_REDIS_URL="redis://b:6379/0")
    assert deployed_values(env)["SWITCHYARD_REDIS_URL"] == "redis://a:6379/0"  # cached
    env["SWITCHYARD_CONFIG_MAX_AGE_S"] = "0"
    assert deployed_values(env)["SWITCHYARD_REDIS_URL"] == "redis://b:6379/0"


def test_connections_read_the_deployed_stack(stack: str, monkeypatch: pytest.MonkeyPatch) -> None:
    put(stack, SWITCHYARD_KAFKA_BOOTSTRAP="kafka.internal:9098")
    unset(monkeypatch, "SWITCHYARD_KAFKA_BOOTSTRAP")  # else kafka.internal stays for the next tests
    monkeypatch.setenv(CONFIG_PATH_ENV, config_path(stack))
    assert Connections.from_env().kafka_bootstrap == "kafka.internal:9098"


def test_bad_names_and_missing_paths_are_clear_errors(stack: str) -> None:
    with pytest.raises(ConfigError, match="invalid stack name"):
        config_path("../x")
    with pytest.raises(ConfigError, match="no configuration under"):
        deployed_values({CONFIG_PATH_ENV: config_path(stack)})
    with pytest.raises(ConfigError, match="SWITCHYARD_CONFIG_MAX_AGE_S must be an integer"):
        deployed_values({CONFIG_PATH_ENV: config_path(stack), "SWITCHYARD_CONFIG_MAX_AGE_S": "soon"})
    assert deployed_values({}) == {}  # no path: local defaults, no AWS call


def test_cli_stack_option_reads_parameters_and_fills_secrets(
        stack: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``switchyard --stack NAME config``: the Lambda functions' path, passwords filled but never printed."""
    secrets = boto3.client("secretsmanager", endpoint_url=MOTO)
    arn = secrets.create_secret(Name=unique("sy-cli"), SecretString=json.dumps(
        {"username": "svc", "password": "s3cr:et"}))["ARN"]
    try:
        put(stack, SWITCHYARD_AMQP_URL="amqp://{username}:{password}@mq.internal:5671/%2F",
            SWITCHYARD_AMQP_SECRET_ARN=arn)
        unset(monkeypatch, "SWITCHYARD_AMQP_URL", "SWITCHYARD_AMQP_SECRET_ARN")
        assert main(["--stack", stack, "config"]) == 0
        printed = capsys.readouterr().out
        assert f"SSM {config_path(stack)}" in printed
        assert "amqp://svc:***@mq.internal:5671/%2F" in printed and "s3cr" not in printed
        assert Connections.from_env().amqp_url == "amqp://svc:s3cr%3Aet@mq.internal:5671/%2F"
        # neither the URL nor its password enters the process environment: the deployed configuration is
        # passed to the reader as values (child processes read it, and the secret, themselves)
        assert "SWITCHYARD_AMQP_URL" not in os.environ
    finally:
        secrets.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)


def test_cli_unknown_stack_says_what_to_do(stack: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--stack", stack, "config"]) == 1
    assert "is the stack deployed" in capsys.readouterr().err


def test_a_process_reads_only_the_secrets_of_the_services_it_uses(
        stack: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each role may read only its own services' secrets (issue 22): settings that name every
    service's secret must not make a process that uses only the broker read the others."""
    secrets = boto3.client("secretsmanager", endpoint_url=MOTO)
    arn = secrets.create_secret(Name=unique("sy-amqp"), SecretString=json.dumps(
        {"username": "svc", "password": "pw"}))["ARN"]
    unreadable = arn.rsplit(":", 1)[0] + ":" + unique("sy-not-granted")  # as AccessDenied: no value
    try:
        put(stack, SWITCHYARD_AMQP_URL="amqp://{username}:{password}@mq.internal:5671/%2F",
            SWITCHYARD_AMQP_SECRET_ARN=arn,
            SWITCHYARD_REDIS_URL="rediss://:{password}@redis.internal:6379/0",
            SWITCHYARD_REDIS_SECRET_ARN=unreadable,
            SWITCHYARD_POSTGRES_DSN="postgresql://{username}:{password}@{host}:{port}/{dbname}",
            SWITCHYARD_POSTGRES_SECRET_ARN=unreadable)
        for service, urls in SECRET_URLS.items():
            unset(monkeypatch, *urls, *source_variables(service))
        monkeypatch.setenv(CONFIG_PATH_ENV, config_path(stack))
        connections = Connections.from_env()
        assert connections.amqp_url == "amqp://svc:pw@mq.internal:5671/%2F"
        with pytest.raises(ConfigError, match="cannot read secret"):
            connections.redis_url  # noqa: B018 - the read is the test: the secret is fetched on use
    finally:
        secrets.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
