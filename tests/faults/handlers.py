"""The worker handler of the fault suite: echoes, and counts every handling in Redis.

A request handled twice (redelivered after a worker was killed, say) shows up as a duplicate in
the account even though its caller saw only one answer. For the strangers' scenario it also sheds
(``Requeue``) once a request that asks for it, and notes a producer's own ``x-switchyard-user-id``
that reached it.
"""

from __future__ import annotations

import os
from dataclasses import replace

from switchyard.core.config import Connections
from switchyard.core.redis_client import RedisClient, connect_redis
from switchyard.rpc import protocol
from switchyard.rpc.worker import Request, Requeue
from tests.faults.strangers import FORGED_USER_ID, SHED_HEADER

# The Redis the counts go to, straight (the pool's own may be cut by a scenario's proxy).
FAULTS_REDIS_ENV = "SWITCHYARD_FAULTS_REDIS_URL"
_redis: RedisClient | None = None


def handled_key(pool: str, what: str = "handled") -> str:
    """The Redis hash of handling counts (outside the pool's state prefix, so a state flush keeps it);
    ``what``: ``shed`` (requests shed once) and ``forged`` (a forged user id reached the handler)."""
    return f"switchyard-faults:{pool}:{what}"


def count(request: Request) -> bytes:
    global _redis
    if _redis is None:
        connections = Connections.from_env()  # a Redis Cluster's flag with it
        _redis = connect_redis(replace(connections,
                                       redis_url=os.environ.get(FAULTS_REDIS_ENV) or connections.redis_url))
    pool = os.environ["WORKER_POOL"]
    if request.headers.get(SHED_HEADER) and _redis.hincrby(handled_key(pool, "shed"), request.text(), 1) == 1:
        raise Requeue
    if request.headers.get(protocol.ORIGINAL_USER_ID_HEADER) == FORGED_USER_ID:
        _redis.hincrby(handled_key(pool, "forged"), request.text(), 1)
    _redis.hincrby(handled_key(pool), request.text(), 1)
    return request.body
