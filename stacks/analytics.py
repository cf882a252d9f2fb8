"""EMR Serverless: the application, the S3 bucket and the job role of the PySpark pipeline.

The pipeline itself comes with its own issue; what it needs is here: a Spark application in the
private subnets (EMR security group: a client of the broker and of MSK), a bucket for code, input
and logs, and a job role that can read/write that bucket, read the broker's credentials and
read/write the delay topics.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_emrserverless as emr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks import constants
from stacks.broker import BrokerConstruct
from stacks.config import DeploymentConfig
from stacks.data import DataConstruct
from stacks.functions import FunctionsConstruct
from stacks.grants import kafka_access
from stacks.names import physical_name
from stacks.network import NetworkConstruct, allow_from
from switchyard.rpc.control.access import BrokerRole


def pipeline_bucket(scope: Construct, construct_id: str) -> s3.Bucket:
    """The pipeline's bucket (code, inputs, results, logs): the same in both targets."""
    return s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.S3_MANAGED,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        enforce_ssl=True,
        versioned=True,
        removal_policy=RemovalPolicy.RETAIN,  # job inputs and results outlive the stack
        # Versioning keeps every overwritten result (``--resume`` rewrites them): old versions and
        # failed multipart uploads are paid for until they expire.
        lifecycle_rules=[s3.LifecycleRule(
            noncurrent_version_expiration=Duration.days(constants.PIPELINE_OLD_VERSIONS_DAYS),
            abort_incomplete_multipart_upload_after=Duration.days(1))],
    )


class AnalyticsConstruct(Construct):
    """``application``, ``bucket`` and ``job_role``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        network: NetworkConstruct,
        broker: BrokerConstruct,
        data: DataConstruct,
        functions: FunctionsConstruct,
        config: DeploymentConfig,
    ) -> None:
        super().__init__(scope, construct_id)
        self.bucket = pipeline_bucket(self, "Bucket")
        self.application = emr.CfnApplication(
            self,
            "Spark",
            name=physical_name(self, "pipeline", max_length=constants.EMR_APPLICATION_NAME_CHARS),
            release_label=constants.EMR_RELEASE,
            type="SPARK",
            network_configuration=emr.CfnApplication.NetworkConfigurationProperty(
                subnet_ids=network.vpc.select_subnets(
                    subnet_type=network.egress_subnets.subnet_type
                ).subnet_ids,
                security_group_ids=[network.emr_sg.security_group_id],
            ),
            auto_start_configuration=emr.CfnApplication.AutoStartConfigurationProperty(enabled=True),
            auto_stop_configuration=emr.CfnApplication.AutoStopConfigurationProperty(
                enabled=True, idle_timeout_minutes=15
            ),
            maximum_capacity=emr.CfnApplication.MaximumAllowedResourcesProperty(
                cpu="16 vCPU", memory="64 GB"
            ),
            # EMR 7.x runs Python 3.9; the job's archive needs the python3.11 of the image that
            # scripts/emr-image.Dockerfile builds (switchyard:emrImage, its ECR URI).
            image_configuration=emr.CfnApplication.ImageConfigurationInputProperty(
                image_uri=config.emr_image
            ) if config.emr_image else None,
        )
        # The jobs' clients: MSK's and the broker's groups admit EMR's (stacks/network.py makes it).
        allow_from(network.msk_sg, constants.MSK_IAM_PORT, "Kafka SASL/IAM", network.emr_sg)
        for port, what in ((constants.AMQPS_PORT, "AMQPS"),
                           (constants.HTTPS_PORT, "RabbitMQ management API")):
            allow_from(broker.security_group, port, what, network.emr_sg)
        self.job_role = iam.Role(
            self,
            "JobRole",
            # Only EMR Serverless acting for this account may assume it (the confused deputy guard).
            assumed_by=iam.ServicePrincipal(
                "emr-serverless.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            ),
            description="Switchyard PySpark jobs: their bucket, the broker clients' secret, the topics",
        )
        self.bucket.grant_read_write(self.job_role)
        self.job_role.add_to_policy(
            iam.PolicyStatement(
                actions=["secretsmanager:GetSecretValue"],
                resources=[broker.user_secret(BrokerRole.CLIENTS).secret_arn],  # not the admin's
            )
        )
        # The job schedules rows through the delay input topic with an idempotent producer.
        kafka_access(self.job_role, data.kafka.attr_arn, write=(config.delay.input_topic,))
