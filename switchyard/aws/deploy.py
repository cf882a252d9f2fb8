"""What ``cdk deploy`` runs inside the VPC: CloudFormation custom resources (CDK Provider framework).

Each operation takes the custom resource event (``RequestType``, ``ResourceProperties``) and
returns the Provider framework's answer (``PhysicalResourceId``, ``Data``); raising fails the
deployment with the error's message. Every operation is idempotent: CloudFormation retries,
and an Update runs the whole operation again. Delete keeps the data (queues that may hold
requests, the delay table, the topics): tearing the stack down removes the broker, the database
and the cluster themselves. The pools resource's Delete first stops the worker tasks the control
plane started (``switchyard/aws/teardown.py``): ECS deletes no cluster that still runs tasks.

The handlers in ``functions/deploy_*.py`` only call these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from switchyard.core.config import Connections
from switchyard.core.errors import ConfigError
from switchyard.core.msk_auth import kafka_security_config
from switchyard.core.observability import logger

# The pools' worker tasks get this long to stop on Delete (a worker has ECS's stopTimeout, 30 s by
# default, to finish its request after SIGTERM); the function's own timeout is 300 s.
STOP_TIMEOUT_S = 240


def _answer(physical_id: str, **data: Any) -> dict[str, Any]:
    return {"PhysicalResourceId": physical_id, "Data": {k: str(v) for k, v in data.items()}}


def _properties(event: Mapping[str, Any], *names: str) -> list[Any]:
    props = event.get("ResourceProperties") or {}
    missing = [n for n in names if n not in props]
    if missing:
        raise ConfigError(f"custom resource properties lack {', '.join(missing)}")
    return [props[n] for n in names]


def _on_create_or_update(event: Mapping[str, Any], physical_id: str, work: Callable[[], dict[str, Any]],
                         on_delete: Callable[[], object] | None = None) -> dict[str, Any]:
    kind = event.get("RequestType")
    if kind == "Delete":
        if on_delete is not None:
            on_delete()
        logger.info("custom resource deleted; data kept", extra={"resource": physical_id})
        return _answer(event.get("PhysicalResourceId") or physical_id)
    if kind not in ("Create", "Update"):
        raise ConfigError(f"unknown custom resource RequestType {kind!r}")
    return _answer(physical_id, **work())


def declare_pools(event: Mapping[str, Any]) -> dict[str, Any]:
    """``switchyard pool init`` (exchanges, queues, bindings, policies) for every pool listed, then the
    broker users of ``Users`` (optional: ``Role``, ``Pool`` ("" for the deployment-wide roles),
    ``SecretArn`` each, and ``Application`` for a clients user of one application's reply queues),
    each with its secret's username and password and its role's permissions
    (switchyard/rpc/control/access.py); the probe's user in the vhost ``ProbeVhost`` (optional),
    made here."""
    from switchyard.rpc.control.topology import init_pool
    from switchyard.rpc.protocol import DEAD_LETTER_PROBE_VHOST, validate_pool
    from switchyard.rpc.settings import RpcSettings

    (pools,) = _properties(event, "Pools")
    pools = [validate_pool(pool) for pool in pools]
    props = event.get("ResourceProperties") or {}
    users = _broker_users(props.get("Users") or [])
    probe_vhost = str(props.get("ProbeVhost") or DEAD_LETTER_PROBE_VHOST)

    def work() -> dict[str, Any]:
        settings = RpcSettings.from_env()
        for pool in pools:
            init_pool(pool, settings)
            logger.info("pool declared", extra={"pool": pool})
        made = _ensure_users(settings, pools, users, probe_vhost)
        return {"Pools": ",".join(pools), "Users": ",".join(made) or "none"}

    return _on_create_or_update(event, "switchyard-pools", work, lambda: _stop_workers(event))


def _stop_workers(event: Mapping[str, Any], client: Any = None) -> None:
    """On Delete: stop the pools' worker tasks (``Cluster``, ``Families``: their task definition
    families) so CloudFormation can delete the cluster; absent when the stack runs no ECS workers."""
    from switchyard.aws.teardown import stop_worker_tasks
    from switchyard.rpc.drivers.ecs import ecs_client

    props = event.get("ResourceProperties") or {}
    if props.get("Cluster"):
        stop_worker_tasks(client or ecs_client(), str(props["Cluster"]), list(props.get("Families") or []),
                          timeout_s=float(props.get("StopTimeoutSeconds", STOP_TIMEOUT_S)))


def _broker_users(raw: Sequence[Any]) -> list[tuple[Any, str]]:
    """``(BrokerUser, secret ARN)`` of each ``Users`` entry, checked before any work."""
    from switchyard.rpc.control.access import BrokerRole, BrokerUser

    users = []
    for entry in raw:
        if not isinstance(entry, Mapping) or not {"Role", "Pool", "SecretArn"} <= entry.keys():
            raise ConfigError(f"each of Users needs Role, Pool and SecretArn, got {entry!r}")
        try:
            role = BrokerRole(entry["Role"])
        except ValueError as exc:
            raise ConfigError(f"unknown broker role {entry['Role']!r}") from exc
        users.append((BrokerUser(role, entry["Pool"] or None, entry.get("Application") or None),
                      str(entry["SecretArn"])))
    return users


def _ensure_users(settings: Any, pools: Sequence[str], users: Sequence[tuple[Any, str]],
                  probe_vhost: str) -> list[str]:
    from urllib.parse import unquote, urlsplit

    from switchyard.core.aws_secrets import fetch_secret
    from switchyard.core.config import service_urls
    from switchyard.rpc.control.access import Credentials, ensure_users
    from switchyard.rpc.control.management import ManagementApi, vhost_from_amqp_url

    if not users:
        return []
    conn = settings.connections
    credentials = [(user, Credentials.from_secret(fetch_secret(arn), f"the {user.role} secret {arn}"))
                   for user, arn in users]
    management = ManagementApi(conn.management_url, vhost_from_amqp_url(conn.amqp_url))
    admin = unquote(urlsplit(service_urls(conn.management_url)[0]).username or "")  # every node's is the same
    probe = ManagementApi(conn.management_url, probe_vhost)
    made = ensure_users(management, pools, credentials, admin, probe)
    logger.info("broker users set", extra={"users": made})
    return made


def migrate_delay_schema(event: Mapping[str, Any]) -> dict[str, Any]:
    """``switchyard delay migrate``: create or upgrade the delay store's schema (advisory-locked)."""
    from switchyard.delay.settings import DelaySettings
    from switchyard.delay.store import PostgresDelayStore

    def work() -> dict[str, Any]:
        settings = DelaySettings.from_env()
        store = PostgresDelayStore(Connections.from_env().postgres_dsn, settings.schema,
                                   f"{settings.application_name}-migrate")
        try:
            applied = store.migrate()
        finally:
            store.close()
        return {"Schema": settings.schema, "Applied": ",".join(map(str, applied)) or "none"}

    return _on_create_or_update(event, "switchyard-delay-schema", work)


def create_topics(event: Mapping[str, Any], admin: Any = None) -> dict[str, Any]:
    """Create the delay topics (``Topics``: names, ``Partitions``, ``ReplicationFactor``) if missing.

    A topic that exists with fewer partitions is grown (Kafka cannot shrink one); existing
    topics are otherwise left as they are.
    """
    from switchyard.delay.settings import validate_topic

    topics, partitions, replication = _properties(event, "Topics", "Partitions", "ReplicationFactor")
    topics = [validate_topic(t) for t in topics]

    def work() -> dict[str, Any]:
        client = admin or _admin_client()
        created, grown = ensure_topics(client, topics, int(partitions), int(replication))
        return {"Created": ",".join(created) or "none", "Grown": ",".join(grown) or "none"}

    return _on_create_or_update(event, "switchyard-delay-topics", work)


def _admin_client() -> Any:
    from confluent_kafka.admin import AdminClient

    config = {"bootstrap.servers": Connections.from_env().kafka_bootstrap, **kafka_security_config()}
    return AdminClient(config)


def ensure_topics(admin: Any, topics: Sequence[str], partitions: int,
                  replication: int, timeout: float = 30.0) -> tuple[list[str], list[str]]:
    """Create missing topics and grow ones with fewer partitions; returns (created, grown)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewPartitions, NewTopic

    if partitions < 1 or replication < 1:
        raise ConfigError("topics need at least one partition and one replica")
    existing = admin.list_topics(timeout=timeout).topics
    missing = [t for t in topics if t not in existing]
    created: list[str] = []
    if missing:
        futures = admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=replication)
                                       for t in missing], request_timeout=timeout)
        for topic, future in futures.items():
            try:
                future.result(timeout)
                created.append(topic)
            except KafkaException as exc:  # created by a concurrent deploy: fine
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    small = [t for t in topics if t in existing and len(existing[t].partitions) < partitions]
    if small:
        for future in admin.create_partitions([NewPartitions(t, partitions) for t in small],
                                              request_timeout=timeout).values():
            future.result(timeout)
    # not "created": a LogRecord's own attribute, which logging refuses to overwrite (KeyError)
    logger.info("delay topics ensured", extra={"topics_created": created, "topics_grown": small})
    return created, small
