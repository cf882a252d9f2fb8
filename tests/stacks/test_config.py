"""A bad deployment configuration fails synth with a clear error naming its context key."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk import App, Stack

from stacks import constants
from stacks.config import ConfigError, DeploymentConfig, PoolConfig
from switchyard.rpc.protocol import MAX_POOL_NAME_CHARS, validate_pool


def config(**context: Any) -> DeploymentConfig:
    return DeploymentConfig.from_context(Stack(App(context=context)))


def test_defaults_give_one_example_pool_and_a_connection_budget_within_the_limit() -> None:
    cfg = config()
    assert [p.name for p in cfg.pools] == [constants.EXAMPLE_POOL]
    assert cfg.postgres_connection_budget == 3 * 1 + 2 * 2 + 2 * 1 + 3 * 1 + 1
    assert cfg.postgres_connection_budget <= cfg.postgres.max_connections // 2


def test_context_from_the_command_line_is_json() -> None:
    cfg = config(
        **{constants.CTX_POOLS: json.dumps([{"name": "a"}, {"name": "b"}]),
           constants.CTX_DELAY: '{"partitions": 6}'}
    )
    assert [p.name for p in cfg.pools] == ["a", "b"]
    assert cfg.delay.partitions == 6


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({constants.CTX_POOLS: [{"name": "bad-name"}]}, "invalid pool name 'bad-name'"),
        ({constants.CTX_POOLS: [{"name": "x" * (MAX_POOL_NAME_CHARS + 1)}]},
         f"at most {MAX_POOL_NAME_CHARS} char"),
        ({constants.CTX_POOLS: [{"name": "a"}, {"name": "a"}]}, r"repeated: \['a'\]"),
        ({constants.CTX_POOLS: []}, "at least one pool"),
        ({constants.CTX_POOLS: [{"handler": "x:y"}]}, 'objects with a "name"'),
        ({constants.CTX_POOLS: [{"name": "a", "cpu": 256, "memoryMib": 4096}]},
         "not a Fargate size for cpu 256"),
        ({constants.CTX_POOLS: [{"name": "a", "minWorkers": 3, "maxWorkers": 2}]},
         "minWorkers <= maxWorkers"),
        ({constants.CTX_POOLS: [{"name": "a", "batchSize": 20000}]}, "batchSize must be 1-10,000"),
        ({constants.CTX_POOLS: [{"name": "a", "handler": "nocolon"}]}, "module:function"),
        ({constants.CTX_POOLS: [{"name": "a", "maxWorkerz": 3}]}, r"unknown setting\(s\) \['maxWorkerz'\]"),
        ({constants.CTX_POOLS: [{"name": "a", "maxWorkers": "3"}]}, "maxWorkers must be an integer"),
        ({constants.CTX_DELAY: {"inputTopic": "bad topic"}}, "invalid Kafka topic name"),
        ({constants.CTX_DELAY: {"inputTopic": "t", "outputTopic": "t"}}, "must differ"),
        ({constants.CTX_DELAY: {"schema": "Bad-Schema"}}, "invalid Postgres schema name"),
        ({constants.CTX_DELAY: {"startingPosition": "AT_TIMESTAMP"}}, "LATEST or TRIM_HORIZON"),
        ({constants.CTX_DELAY: {"partitions": 200}}, "may open 407 connections"),
        ({constants.CTX_MSK: {"brokerNodes": 3}}, "multiple of the 2 availability zones"),
        ({constants.CTX_POSTGRES: {"engineVersion": "12"}}, "engineVersion must be one of"),
        ({constants.CTX_REDIS: {"engine": "memcached"}}, "redis or valkey"),
        ({constants.CTX_REDIS: {"engine": "redis", "engineVersion": "6.0"}}, "Redis 6.2 or later"),
        ({constants.CTX_REDIS: {"engineVersion": "latest"}}, "Redis 6.2 or later"),
        ({constants.CTX_REDIS: {"shards": 2}}, "shards 2 needs clusterMode true"),
        ({constants.CTX_REDIS: {"clusterMode": True}}, "clusterMode needs replicas >= 1"),
        ({constants.CTX_REDIS: {"clusterMode": True, "replicas": 1, "shards": 0}}, "shards must be 1-500"),
        ({constants.CTX_REDIS: {"clusterMode": True, "replicas": 5, "shards": 100}}, "600 nodes, more than"),
        ({constants.CTX_REDIS: {"clusterMode": "yes"}}, "clusterMode must be true or false"),
        ({constants.CTX_DELAY: "{not json"}, "not valid JSON"),
        ({constants.CTX_ALARM_EMAIL: "nobody"}, "not an e-mail address"),
        ({constants.CTX_EMR_IMAGE: "docker.io/library/python:3.11"}, "not an ECR image URI"),
        ({constants.CTX_EMR_IMAGE: "123456789012.dkr.ecr.eu-west-1.amazonaws.com/x:1 ; rm"},
         "not an ECR image URI"),
    ],
)
def test_bad_values_fail_synth_with_a_message_naming_the_key(context: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        config(**context)
    assert "switchyard:" in str(raised.value) or "invalid" in str(raised.value)


@pytest.mark.parametrize(("engine", "version", "group"), [
    ("valkey", "8.0", "default.valkey8.cluster.on"),
    ("valkey", "7.2", "default.valkey7.cluster.on"),
    ("redis", "7.1", "default.redis7.cluster.on"),
    ("redis", "6.2", "default.redis6.x.cluster.on"),
])
def test_cluster_mode_takes_the_cluster_on_parameter_group(engine: str, version: str, group: str) -> None:
    redis = config(**{constants.CTX_REDIS: {"clusterMode": True, "shards": 3, "replicas": 2, "engine": engine,
                                            "engineVersion": version}}).redis
    assert (redis.cluster_parameter_group, redis.nodes) == (group, 9)


def test_queue_depth_threshold_is_what_max_workers_are_sized_for() -> None:
    assert PoolConfig(name="p", max_workers=5, target_backlog=20).queue_depth_threshold == 100


def test_one_pool_name_limit_for_the_cli_and_a_deployment() -> None:
    """A pool name the CLI takes is one a deployment takes, and one character more neither does."""
    longest = "p" * MAX_POOL_NAME_CHARS
    assert validate_pool(longest) == longest
    assert PoolConfig(name=longest).name == longest
    with pytest.raises(ConfigError, match=f"at most {MAX_POOL_NAME_CHARS} characters"):
        PoolConfig(name=longest + "p")
    with pytest.raises(ValueError, match=f"1 to {MAX_POOL_NAME_CHARS} characters"):
        validate_pool(longest + "p")
