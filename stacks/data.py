"""The data services: MSK (delay topics), RDS Postgres (delay store), ElastiCache (pool state).

All three live in the isolated subnets behind their own security group (``NetworkConstruct``),
encrypt in transit and at rest, and keep their credentials in Secrets Manager:

- MSK authenticates with IAM only (the Lambda MSK event source and the confluent-kafka producer,
  signed by ``aws-msk-iam-sasl-signer-python``, both support it; no password to rotate). Its
  IAM bootstrap string is read at deploy time (``GetBootstrapBrokers``): CloudFormation has no
  attribute for it.
- RDS Postgres with a generated secret (``username``/``password``/``host``/``port``/``dbname``).
  No RDS Proxy: the delay functions' connections are few and bounded at synth time (the
  connection budget in ``stacks/config.py``), each warm environment keeps its connections, and
  the store loads batches through a temporary table, which pins every proxied session (RDS
  Proxy could not multiplex them, only add cost and a hop).
- ElastiCache (Valkey by default) with TLS and an AUTH token generated into Secrets Manager; one
  primary with optional replicas, or with ``clusterMode`` a Redis Cluster of shards (each a primary
  and its replicas), which the processes reach through its configuration endpoint.
"""

from __future__ import annotations

from typing import Any, TypeVar

from aws_cdk import Duration, Fn, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticache as elasticache
from aws_cdk import aws_logs as logs
from aws_cdk import aws_msk as msk
from aws_cdk import aws_rds as rds
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import custom_resources as cr
from constructs import Construct

from stacks import constants
from stacks.config import DeploymentConfig
from stacks.names import physical_name
from stacks.network import NetworkConstruct
from stacks.secrets import generated_secret

KAFKA_CLUSTER_SUFFIX = "kafka"  # {stack}-kafka, at most 64 characters (MSK's limit)
KAFKA_CLUSTER_NAME_CHARS = 64
REDIS_GROUP_SUFFIX = "state"  # {stack}-state, lower case, at most 40 characters (ElastiCache's limit)
REDIS_GROUP_ID_CHARS = 40
POSTGRES_DATABASE = "switchyard"
POSTGRES_USER = "switchyard"
T = TypeVar("T")


def chosen(value: T | None, part: str) -> T:
    """A service of a part the stack deploys: asking for one it does not is the stack's own bug."""
    if value is None:
        raise AssertionError(f"built only with {part} in {constants.CTX_PARTS}")
    return value


class DataConstruct(Construct):
    """``kafka`` (``kafka_bootstrap``), ``postgres`` (``postgres_secret``), ``redis`` (``redis_secret``)."""

    def __init__(
        self, scope: Construct, construct_id: str, *, network: NetworkConstruct, config: DeploymentConfig
    ) -> None:
        super().__init__(scope, construct_id)
        self.network = network
        self.config = config
        self.isolated = network.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
        # Only the chosen parts' services (switchyard:parts): MSK and RDS are the delay scheduler's,
        # ElastiCache the pools', the pending queue's and the bus's.
        delay = config.has(constants.PART_DELAY)
        self._kafka = self._build_kafka() if delay else None
        self._postgres = self._build_postgres() if delay else None
        self._redis = self._build_redis() if config.redis_needed else None

    @property
    def kafka(self) -> msk.CfnCluster:
        return chosen(self._kafka, constants.PART_DELAY)[0]

    @property
    def kafka_bootstrap_lookup(self) -> cr.AwsCustomResource:
        return chosen(self._kafka, constants.PART_DELAY)[1]

    @property
    def postgres(self) -> rds.DatabaseInstance:
        return chosen(self._postgres, constants.PART_DELAY)

    @property
    def redis_secret(self) -> secretsmanager.Secret:
        return chosen(self._redis, "rpc, pending or bus")[0]

    @property
    def redis(self) -> elasticache.CfnReplicationGroup:
        return chosen(self._redis, "rpc, pending or bus")[1]

    # -- MSK ------------------------------------------------------------------------------------
    def _build_kafka(self) -> tuple[msk.CfnCluster, cr.AwsCustomResource]:
        cfg = self.config.msk
        log_group = logs.LogGroup(
            self,
            "KafkaBrokerLogs",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )
        cluster = msk.CfnCluster(
            self,
            "Kafka",
            cluster_name=physical_name(self, KAFKA_CLUSTER_SUFFIX, max_length=KAFKA_CLUSTER_NAME_CHARS),
            kafka_version=cfg.kafka_version,
            number_of_broker_nodes=cfg.broker_nodes,
            broker_node_group_info=msk.CfnCluster.BrokerNodeGroupInfoProperty(
                instance_type=cfg.instance_type,
                client_subnets=self.isolated.subnet_ids,
                security_groups=[self.network.msk_sg.security_group_id],
                storage_info=msk.CfnCluster.StorageInfoProperty(
                    ebs_storage_info=msk.CfnCluster.EBSStorageInfoProperty(volume_size=cfg.volume_gib)
                ),
            ),
            client_authentication=msk.CfnCluster.ClientAuthenticationProperty(
                sasl=msk.CfnCluster.SaslProperty(iam=msk.CfnCluster.IamProperty(enabled=True)),
                unauthenticated=msk.CfnCluster.UnauthenticatedProperty(enabled=False),
            ),
            encryption_info=msk.CfnCluster.EncryptionInfoProperty(
                encryption_in_transit=msk.CfnCluster.EncryptionInTransitProperty(
                    client_broker="TLS", in_cluster=True
                )
            ),
            logging_info=msk.CfnCluster.LoggingInfoProperty(
                broker_logs=msk.CfnCluster.BrokerLogsProperty(
                    cloud_watch_logs=msk.CfnCluster.CloudWatchLogsProperty(
                        enabled=True, log_group=log_group.log_group_name
                    )
                )
            ),
        )
        bootstrap = cr.AwsCustomResource(
            self,
            "KafkaBootstrap",
            on_update=cr.AwsSdkCall(
                service="Kafka",
                action="getBootstrapBrokers",
                parameters={"ClusterArn": cluster.attr_arn},
                physical_resource_id=cr.PhysicalResourceId.of(cluster.attr_arn),
                output_paths=["BootstrapBrokerStringSaslIam"],
            ),
            policy=cr.AwsCustomResourcePolicy.from_sdk_calls(resources=[cluster.attr_arn]),
            install_latest_aws_sdk=False,
        )
        return cluster, bootstrap

    @property
    def kafka_bootstrap(self) -> str:
        """The SASL/IAM bootstrap servers (a deploy-time token)."""
        return self.kafka_bootstrap_lookup.get_response_field("BootstrapBrokerStringSaslIam")

    # -- RDS --------------------------------------------------------------------------------------
    def _build_postgres(self) -> rds.DatabaseInstance:
        cfg = self.config.postgres
        version = getattr(rds.PostgresEngineVersion, constants.POSTGRES_VERSIONS[cfg.engine_version])
        return rds.DatabaseInstance(
            self,
            "Postgres",
            engine=rds.DatabaseInstanceEngine.postgres(version=version),
            instance_type=ec2.InstanceType(cfg.instance_type),
            vpc=self.network.vpc,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED),
            security_groups=[self.network.postgres_sg],
            credentials=rds.Credentials.from_generated_secret(POSTGRES_USER),
            database_name=POSTGRES_DATABASE,
            allocated_storage=cfg.allocated_storage_gib,
            max_allocated_storage=cfg.allocated_storage_gib * constants.POSTGRES_STORAGE_GROWTH,
            storage_type=rds.StorageType.GP3,  # 3,000 IOPS baseline at any size, cheaper per GB than gp2
            ca_certificate=rds.CaCertificate.RDS_CA_RSA2048_G1,  # its roots are in switchyard/core/certs
            storage_encrypted=True,
            multi_az=cfg.multi_az,
            deletion_protection=cfg.deletion_protection or self.config.production,
            iam_authentication=True,
            backup_retention=Duration.days(7),
            cloudwatch_logs_exports=["postgresql"],
            cloudwatch_logs_retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=self.data_removal_policy,
        )

    @property
    def data_removal_policy(self) -> RemovalPolicy:
        """Production: a final snapshot when the store is deleted or replaced; otherwise nothing is
        kept, so ``cdk destroy`` of a trial or staging stack leaves no snapshots that cost money."""
        return RemovalPolicy.SNAPSHOT if self.config.production else RemovalPolicy.DESTROY

    @property
    def postgres_secret(self) -> secretsmanager.ISecret:
        secret = self.postgres.secret
        assert secret is not None  # from_generated_secret always makes one
        return secret

    # -- ElastiCache --------------------------------------------------------------------------------
    def _build_redis(self) -> tuple[secretsmanager.Secret, elasticache.CfnReplicationGroup]:
        cfg = self.config.redis
        secret = generated_secret(
            self, "RedisAuthToken", key="password", length=64,
            description="ElastiCache AUTH token of Switchyard's pool state (JSON password)")
        subnets = elasticache.CfnSubnetGroup(
            self,
            "RedisSubnets",
            description="Switchyard pool state: isolated subnets",
            subnet_ids=self.isolated.subnet_ids,
        )
        group = elasticache.CfnReplicationGroup(
            self,
            "Redis",
            replication_group_id=self.redis_group_id,
            replication_group_description="Switchyard pool state (generations, activity, locks)",
            engine=cfg.engine,
            engine_version=cfg.engine_version,
            cache_node_type=cfg.node_type,
            **self._redis_topology(),
            transit_encryption_enabled=True,
            at_rest_encryption_enabled=True,
            auth_token=secret.secret_value_from_json("password").unsafe_unwrap(),
            cache_subnet_group_name=subnets.ref,
            security_group_ids=[self.network.redis_sg.security_group_id],
            port=constants.REDIS_PORT,
            snapshot_retention_limit=1,
        )
        group.apply_removal_policy(self.data_removal_policy)  # DeletionPolicy: Snapshot or Delete
        return secret, group

    def _redis_topology(self) -> dict[str, Any]:
        """One primary with its replicas, or (cluster mode) shards of a primary and replicas each,
        on the engine's ``cluster.on`` parameter group. Failover and Multi-AZ need a replica."""
        cfg = self.config.redis
        failover = {"automatic_failover_enabled": cfg.replicas > 0, "multi_az_enabled": cfg.replicas > 0}
        if not cfg.cluster_mode:
            return {"num_cache_clusters": 1 + cfg.replicas, **failover}
        return {"cluster_mode": "enabled", "num_node_groups": cfg.shards,
                "replicas_per_node_group": cfg.replicas,
                "cache_parameter_group_name": cfg.cluster_parameter_group, **failover}

    @property
    def redis_member_ids(self) -> list[str]:
        """Each shard's first node's cache cluster id, the dimension of ElastiCache's per-node metrics
        (``{group}-001``; in cluster mode ``{group}-0001-001``, ``{group}-0002-001``, ...)."""
        if not self.config.redis.cluster_mode:
            return [f"{self.redis_group_id}-001"]
        return [f"{self.redis_group_id}-{shard:04d}-001" for shard in range(1, self.config.redis.shards + 1)]

    @property
    def redis_group_id(self) -> str:
        return physical_name(self, REDIS_GROUP_SUFFIX, max_length=REDIS_GROUP_ID_CHARS, lower=True)

    @property
    def postgres_dsn_template(self) -> str:
        """Every part comes from the RDS secret (see switchyard/core/aws_secrets.py). TLS with the server's
        certificate and host name verified against the RDS CA bundle the package ships
        (``switchyard/core/certs``; the delay store names it as ``sslrootcert``)."""
        return "postgresql://{username}:{password}@{host}:{port}/{dbname}?sslmode=verify-full"

    @property
    def redis_url_template(self) -> str:
        """TLS (``rediss``) with the AUTH token from its secret as the password, on the primary
        endpoint, or in cluster mode the configuration endpoint (the client finds every shard from it)."""
        group = self.redis
        host, port = ((group.attr_configuration_end_point_address, group.attr_configuration_end_point_port)
                      if self.config.redis.cluster_mode
                      else (group.attr_primary_end_point_address, group.attr_primary_end_point_port))
        return Fn.join("", ["rediss://:{password}@", host, ":", port, "/0"])
