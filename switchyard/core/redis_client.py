"""The one way Switchyard opens Redis: with timeouts, so a Redis that stops answering fails a call
(which its handler turns into a redelivered batch) instead of hanging the control plane; a single
server or, with ``SWITCHYARD_REDIS_CLUSTER=1``, a Redis Cluster found from the node the URL names."""

from __future__ import annotations

from typing import Any, TypeAlias, TypeGuard

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from switchyard.core.config import REDIS_CLUSTER, REDIS_URL, Connections
from switchyard.core.errors import ConfigError

# What every Redis user of Switchyard takes: one server or a cluster (redis-py routes each
# command to the node owning its key's slot and follows MOVED/ASK after a failover).
RedisClient: TypeAlias = redis.Redis | RedisCluster


def open_redis(url: str, cluster: bool, retry: Retry, *,
               pool_class: type[redis.ConnectionPool] = redis.ConnectionPool, **options: Any) -> RedisClient:
    """A client for ``url`` with ``options`` for every connection (one pool per node on a cluster).

    On a cluster ``retry`` is the cluster client's own (it re-reads the slot map between
    attempts, so a retried command reaches the promoted replica); node clients do not retry."""
    if not cluster:
        return redis.Redis(connection_pool=pool_class.from_url(url, retry=retry, **options))
    if url.startswith("unix:"):
        raise ConfigError(f"{REDIS_CLUSTER.name}=1 needs {REDIS_URL.name} as redis:// or rediss:// "
                          "naming one node of the cluster, not a unix socket")
    return RedisCluster.from_url(url, retry=retry, connection_pool_class=pool_class, **options)


def connect_redis(connections: Connections | None = None) -> RedisClient:
    """A client for ``SWITCHYARD_REDIS_URL`` whose every command fails within
    ``SWITCHYARD_REDIS_TIMEOUT_S`` seconds (per attempt; connection errors are retried twice)."""
    connections = connections or Connections.from_env()
    timeout = connections.redis_timeout_s
    return open_redis(connections.redis_url, connections.redis_cluster,
                      Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=2),
                      socket_timeout=timeout, socket_connect_timeout=timeout, health_check_interval=30)


def is_cluster(client: RedisClient) -> TypeGuard[RedisCluster]:
    return isinstance(client, RedisCluster)


def used_memory(client: RedisClient) -> int:
    """The bytes Redis holds (``INFO memory``): on a cluster summed over every master, the figure
    one server holding the same data would give (a replica holds a copy, not more data)."""
    if not is_cluster(client):
        return int(client.info("memory")["used_memory"])
    per_node = client.info("memory", target_nodes=RedisCluster.PRIMARIES)
    if "used_memory" in per_node:  # a one-master cluster: redis-py gives that node's figures alone
        return int(per_node["used_memory"])
    return sum(int(info["used_memory"]) for info in per_node.values())
