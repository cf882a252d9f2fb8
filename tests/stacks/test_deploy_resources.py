"""What ``cdk deploy`` runs inside the VPC, against the real local services (RabbitMQ, Postgres,
tansu Kafka, moto's Secrets Manager): the custom resources, the secret resolution, MSK auth."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from switchyard.aws import deploy
from switchyard.core import aws_secrets, deployed_config
from switchyard.core.config import Connections
from switchyard.core.errors import ConfigError
from switchyard.core.msk_auth import kafka_security_config
from switchyard.rpc import protocol
from switchyard.rpc.control.management import ManagementApi
from switchyard.rpc.settings import RpcSettings
from tests.conftest import unique
from tests.delay.conftest import delete_topics
from tests.rpc.conftest import delete_pool

MOTO = "http://127.0.0.1:5000"


def event(kind: str, **properties: Any) -> dict[str, Any]:
    return {"RequestType": kind, "ResourceProperties": {"ServiceToken": "arn:x", **properties},
            **({"PhysicalResourceId": "switchyard-x"} if kind != "Create" else {})}


# -- pools ------------------------------------------------------------------------------------------
@pytest.fixture
def pools() -> Iterator[list[str]]:
    names = [unique("deploy_a"), unique("deploy_b")]
    yield names
    settings = RpcSettings.from_env()
    for pool in names:
        delete_pool(settings, pool)


def test_pools_are_declared_with_their_policies_idempotently_and_kept_on_delete(pools: list[str]) -> None:
    settings = RpcSettings.from_env()
    api = ManagementApi(settings.connections.management_url)
    for kind in ("Create", "Update"):  # an Update (or a CloudFormation retry) runs it again
        answer = deploy.declare_pools(event(kind, Pools=pools))
        assert answer["PhysicalResourceId"] == "switchyard-pools"
        assert answer["Data"]["Pools"] == ",".join(pools)
    for pool in pools:
        for queue in (f"{pool}-orphan", f"{pool}-dl", f"{pool}-activity"):
            assert api.get_queue(queue) is not None, queue
        assert api.get_exchange(protocol.req_exchange(pool)) is not None
    deploy.declare_pools(event("Delete", Pools=pools))
    assert api.get_queue(f"{pools[0]}-orphan") is not None  # delete keeps queues that may hold requests


def test_a_bad_pool_name_fails_the_deployment_before_touching_the_broker() -> None:
    with pytest.raises(Exception, match="invalid pool name"):
        deploy.declare_pools(event("Create", Pools=["no-dashes"]))
    with pytest.raises(ConfigError, match="lack Pools"):
        deploy.declare_pools(event("Create"))
    with pytest.raises(ConfigError, match="RequestType"):
        deploy.declare_pools({"RequestType": "Replace", "ResourceProperties": {"Pools": []}})


# -- delay schema -----------------------------------------------------------------------------------
@pytest.fixture
def schema(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = unique("deploy_schema")
    monkeypatch.setenv("SWITCHYARD_DELAY_SCHEMA", name)
    yield name
    with psycopg.connect(Connections.from_env().postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def test_delay_schema_is_migrated_once_then_left_alone(schema: str) -> None:
    first = deploy.migrate_delay_schema(event("Create", Schema=schema))
    assert first["Data"]["Schema"] == schema and first["Data"]["Applied"] != "none"
    again = deploy.migrate_delay_schema(event("Update", Schema=schema))
    assert again["Data"]["Applied"] == "none"
    with psycopg.connect(Connections.from_env().postgres_dsn) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,))}
    assert "delayed_messages" in tables


# -- topics ------------------------------------------------------------------------------------------
def test_topics_are_created_once_with_the_configured_partitions() -> None:
    bootstrap = Connections.from_env().kafka_bootstrap
    topics = [unique("deploy-in"), unique("deploy-out")]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        create = event("Create", Topics=topics, Partitions=3, ReplicationFactor=1)
        answer = deploy.create_topics(create, admin)
        assert sorted(answer["Data"]["Created"].split(",")) == sorted(topics)
        metadata = admin.list_topics(timeout=10).topics
        assert all(len(metadata[t].partitions) == 3 for t in topics)
        again = deploy.create_topics(event("Update", Topics=topics, Partitions=3, ReplicationFactor=1), admin)
        assert again["Data"] == {"Created": "none", "Grown": "none"}
    finally:
        delete_topics(bootstrap, *topics)
    with pytest.raises(Exception, match="invalid Kafka topic name"):
        deploy.create_topics(event("Create", Topics=["bad topic"], Partitions=1, ReplicationFactor=1), admin)


# -- secrets ------------------------------------------------------------------------------------------
@pytest.fixture
def secret_arn(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", MOTO)
    client = boto3.client("secretsmanager", endpoint_url=MOTO)
    name = unique("switchyard-test")
    arn = client.create_secret(Name=name, SecretString=json.dumps(
        {"username": "admin", "password": "p@ss:w/rd%?", "host": "db.internal", "port": 5432,
         "dbname": "switchyard"}))["ARN"]
    deployed_config.forget()
    yield arn
    client.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)


def test_placeholders_are_filled_from_the_secret_and_percent_encoded(secret_arn: str) -> None:
    env = {"SWITCHYARD_AMQP_URL": "amqps://{username}:{password}@b-1.mq.example:5671/%2F",
           "SWITCHYARD_MANAGEMENT_URL": "https://{username}:{password}@b-1.mq.example",
           "SWITCHYARD_AMQP_SECRET_ARN": secret_arn,
           "SWITCHYARD_POSTGRES_DSN": "postgresql://{username}:{password}@{host}:{port}/{dbname}?sslmode=require",
           "SWITCHYARD_POSTGRES_SECRET_ARN": secret_arn}
    aws_secrets.resolve_secrets(env)
    assert env["SWITCHYARD_AMQP_URL"] == "amqps://admin:p%40ss%3Aw%2Frd%25%3F@b-1.mq.example:5671/%2F"
    assert env["SWITCHYARD_MANAGEMENT_URL"] == "https://admin:p%40ss%3Aw%2Frd%25%3F@b-1.mq.example"
    assert env["SWITCHYARD_POSTGRES_DSN"] == (
        "postgresql://admin:p%40ss%3Aw%2Frd%25%3F@db.internal:5432/switchyard?sslmode=require")
    aws_secrets.resolve_secrets(env)  # already filled: nothing left to do, no error


def test_ecs_injected_credentials_need_no_aws_call() -> None:
    env = {"SWITCHYARD_AMQP_URL": "amqps://{username}:{password}@h:5671/%2F",
           "SWITCHYARD_AMQP_USERNAME": "u", "SWITCHYARD_AMQP_PASSWORD": "p w"}
    aws_secrets.resolve_secrets(env)
    assert env["SWITCHYARD_AMQP_URL"] == "amqps://u:p%20w@h:5671/%2F"


def test_missing_secret_fields_and_unreadable_secrets_are_clear_errors(secret_arn: str) -> None:
    with pytest.raises(ConfigError, match="needs password from its secret"):
        aws_secrets.resolve_secrets({"SWITCHYARD_REDIS_URL": "rediss://:{password}@h:6379/0"})
    with pytest.raises(ConfigError, match="needs token from its secret"):
        aws_secrets.resolve_secrets({"SWITCHYARD_REDIS_URL": "rediss://:{token}@h:6379/0",
                                     "SWITCHYARD_REDIS_SECRET_ARN": secret_arn})
    with pytest.raises(ConfigError, match="cannot read secret"):
        aws_secrets.resolve_secrets({"SWITCHYARD_REDIS_URL": "rediss://:{password}@h:6379/0",
                                     "SWITCHYARD_REDIS_SECRET_ARN": secret_arn + "-gone"})


def test_local_urls_without_placeholders_are_left_alone() -> None:
    env = {"SWITCHYARD_AMQP_URL": "amqp://guest:guest@127.0.0.1:5672/%2F"}
    aws_secrets.resolve_secrets(env)
    assert env == {"SWITCHYARD_AMQP_URL": "amqp://guest:guest@127.0.0.1:5672/%2F"}


# -- MSK authentication ----------------------------------------------------------------------------------
def test_kafka_security_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWITCHYARD_KAFKA_AUTH", raising=False)
    assert kafka_security_config() == {}
    monkeypatch.setenv("SWITCHYARD_KAFKA_AUTH", "aws-msk-iam")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    config = kafka_security_config()
    assert config["security.protocol"] == "SASL_SSL" and config["sasl.mechanism"] == "OAUTHBEARER"
    token, expiry = config["oauth_cb"]("")  # signs with the (dummy) credentials: no network call
    assert token and expiry > 0
    monkeypatch.setenv("SWITCHYARD_KAFKA_AUTH", "scram")
    with pytest.raises(ConfigError, match="none or aws-msk-iam"):
        kafka_security_config()
