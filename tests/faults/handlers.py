"""The worker handler of the fault suite: echoes, and counts every handling in Redis.

A request handled twice (redelivered after a worker was killed, say) shows up as a duplicate in
the account even though its caller saw only one answer.
"""

from __future__ import annotations

import os

import redis

from switchyard.core.config import Connections
from switchyard.rpc.worker import Request

# The Redis the counts go to, straight (the pool's own may be cut by a scenario's proxy).
FAULTS_REDIS_ENV = "SWITCHYARD_FAULTS_REDIS_URL"
_redis: redis.Redis | None = None


def handled_key(pool: str) -> str:
    """The Redis hash of handling counts (outside the pool's state prefix, so a state flush keeps it)."""
    return f"switchyard-faults:{pool}:handled"


def count(request: Request) -> bytes:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(os.environ.get(FAULTS_REDIS_ENV) or Connections.from_env().redis_url)
    _redis.hincrby(handled_key(os.environ["WORKER_POOL"]), request.text(), 1)
    return request.body
