"""The bus on a Redis Cluster (SWITCHYARD_REDIS_CLUSTER=1, SWITCHYARD_REDIS_URL naming a node; the
rest of tests/bus runs there unchanged): the figures that read the servers, not one key's slot.
Skipped on a single Redis."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster

from switchyard.bus.store import BusStore


@pytest.fixture
def cluster(store: BusStore) -> RedisCluster:
    if not isinstance(store.redis, RedisCluster):
        pytest.skip("needs a Redis Cluster: SWITCHYARD_REDIS_CLUSTER=1 SWITCHYARD_REDIS_URL=redis://<a node>")
    return store.redis


def masters_memory(cluster: RedisCluster) -> list[int]:
    return [int(node.redis_connection.info("memory")["used_memory"]) for node in cluster.get_primaries()]


def test_used_memory_is_summed_over_every_master(store: BusStore, cluster: RedisCluster) -> None:
    """Autodrop and the memory gauge read what one server's figure would count: every shard."""
    before = masters_memory(cluster)
    used = store.used_memory()
    after = masters_memory(cluster)
    slack = min(before) // 2  # the figures move a little between reads; one master is far more
    assert min(sum(before), sum(after)) - slack <= used <= max(sum(before), sum(after)) + slack, \
        (used, before)
