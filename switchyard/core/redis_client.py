"""The one way Switchyard opens Redis: with timeouts, so a Redis that stops answering fails a call
(which its handler turns into a redelivered batch) instead of hanging the control plane."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from switchyard.core.config import Connections


def connect_redis(connections: Connections | None = None) -> redis.Redis:
    """A client for ``SWITCHYARD_REDIS_URL`` whose every command fails within
    ``SWITCHYARD_REDIS_TIMEOUT`` seconds (per attempt; connection errors are retried twice)."""
    connections = connections or Connections.from_env()
    timeout = connections.redis_timeout_s
    return redis.Redis.from_url(
        connections.redis_url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=2),
    )
