"""The two sizes of ``switchyard:size``: each picks the instance types and the redundancy of every
service together, as defaults of the context keys that set them one by one (an explicit key wins;
for a JSON object key, each of its fields does).

- ``dev``: the smallest each service offers, one of everything. It gives up availability (one broker
  node, one NAT gateway, a single-AZ database, Redis without a replica: a node or zone failure stops
  the part until AWS replaces it), headroom (``mq.t3.micro`` and ``db.t4g.micro`` are burstable, with
  fewer connections and queues) and stability of the workers (Fargate Spot may stop a task with two
  minutes' notice). Data is not kept on ``cdk destroy``.
- ``production``: docs/deployment.md's recommendations: the three-node cluster broker, Multi-AZ RDS,
  a Redis replica with failover, two NAT gateways, MSK on ``kafka.m7g.large``, on-demand Fargate,
  and ``switchyard:production``'s protections (deletion protection, final snapshots).

Without ``switchyard:size`` each key keeps its own default (between the two), so an existing stack
is not replaced by an upgrade.
"""

from __future__ import annotations

from typing import Any

from constructs import Construct

from stacks import constants

DEV, PRODUCTION = "dev", "production"
SIZES = (DEV, PRODUCTION)

PRESETS: dict[str, dict[str, Any]] = {
    DEV: {
        # The smallest Amazon MQ for RabbitMQ instance; it runs 3.13 (4.x needs mq.m7g).
        constants.CTX_BROKER_ENGINE_VERSION: "3.13",
        constants.CTX_BROKER_INSTANCE_TYPE: "mq.t3.micro",
        constants.CTX_BROKER_DEPLOYMENT_MODE: "SINGLE_INSTANCE",
        # 1 GiB: LEAST(DBInstanceClassMemory / 9531392, 5000) is about 100; keep the budget check honest.
        constants.CTX_POSTGRES: {"instanceType": "t4g.micro", "maxConnections": 80, "multiAz": False},
        constants.CTX_REDIS: {"nodeType": "cache.t4g.micro", "replicas": 0},
        constants.CTX_MSK: {"instanceType": "kafka.t3.small", "brokerNodes": 2},
        constants.CTX_NAT_GATEWAYS: 1,
        constants.CTX_PRODUCTION: False,
        constants.CTX_BUS: {"workers": 1, "capacityProvider": "FARGATE_SPOT"},
        "pool.capacityProvider": "FARGATE_SPOT",
    },
    PRODUCTION: {
        constants.CTX_BROKER_ENGINE_VERSION: "4.2",
        constants.CTX_BROKER_INSTANCE_TYPE: "mq.m7g.large",
        constants.CTX_BROKER_DEPLOYMENT_MODE: "CLUSTER_MULTI_AZ",
        constants.CTX_POSTGRES: {"instanceType": "t4g.small", "multiAz": True, "deletionProtection": True},
        constants.CTX_REDIS: {"nodeType": "cache.t4g.small", "replicas": 1},
        constants.CTX_MSK: {"instanceType": "kafka.m7g.large", "brokerNodes": 2},
        constants.CTX_NAT_GATEWAYS: constants.VPC_MAX_AZS,
        constants.CTX_PRODUCTION: True,
        constants.CTX_BUS: {"workers": 2, "capacityProvider": "FARGATE"},
        "pool.capacityProvider": "FARGATE",
    },
}


class SizeError(ValueError):
    """``switchyard:size`` is not one of the sizes (stacks/config.py makes it a ConfigError)."""


def size_of(scope: Construct) -> str:
    """The stack's size, or "" when unset (each key's own default)."""
    raw = scope.node.try_get_context(constants.CTX_SIZE)
    if raw in (None, ""):
        return ""
    if raw not in SIZES:
        raise SizeError(f"{constants.CTX_SIZE} must be one of {list(SIZES)}, got {raw!r}")
    return str(raw)


def preset(scope: Construct, key: str) -> Any:
    """The size's value for ``key``, or None (no size, or the size leaves it alone)."""
    size = size_of(scope)
    return PRESETS[size].get(key) if size else None


def context(scope: Construct, key: str, parse: Any = None) -> Any:
    """``key``'s context value over the size's: an explicit value wins; for JSON objects each of
    its fields wins over the size's (``parse`` turns a ``-c key='{...}'`` string into the object)."""
    explicit = scope.node.try_get_context(key)
    base = preset(scope, key)
    if base is None:
        return explicit
    if explicit is None:
        return base
    if isinstance(base, dict):
        given = parse(explicit) if parse is not None and isinstance(explicit, str) else explicit
        return {**base, **given} if isinstance(given, dict) else given
    return explicit
