"""Settings of the publish job and of its EMR Serverless commands, read once from the environment.

The only module of ``switchyard.spark`` that reads ``os.environ``. ``SparkSettings`` is what the job
needs to reach the pools and the delay scheduler (read on the driver, then shipped to the tasks
with the partition's publisher); ``EmrSettings`` the defaults of ``switchyard spark submit`` /
``package``. Neither imports ``switchyard.rpc`` at import time (it brings pika along), so the
command line loads without it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from switchyard.core.config import KAFKA_BOOTSTRAP, Setting, build, config_source

if TYPE_CHECKING:
    from switchyard.rpc.settings import RpcSettings

APPLICATION_ID = Setting(
    "SWITCHYARD_EMR_APPLICATION_ID", "", "`switchyard spark submit`/`wait`: the EMR Serverless application "
    "(flags win)", shown="none (`switchyard --stack NAME`: the output `PipelineApplicationId`)")
JOB_ROLE_ARN = Setting(
    "SWITCHYARD_EMR_JOB_ROLE_ARN", "", "`switchyard spark submit`: the job's execution role (flags win)",
    shown="none (`--stack`: the output `PipelineJobRoleArn`)")
BUCKET = Setting(
    "SWITCHYARD_PIPELINE_BUCKET", "", "`switchyard spark package`/`submit`: `BUCKET` or `s3://BUCKET/prefix` "
    "the job's files go to (prefix default `switchyard/spark`)", shown="none (`--stack`: the output "
    "`PipelineBucket`)")
LOG_URI = Setting("SWITCHYARD_EMR_LOG_URI", "", "`switchyard spark submit`: the job runs' S3 log location",
                  shown="`s3://BUCKET/<prefix>/logs/`")
# Read by the launcher on EMR (a shell script: switchyard.spark.package), not by Python.
EMR_PYTHON = Setting("SWITCHYARD_EMR_PYTHON", "python3.11",
                     "on EMR, the interpreter the packaged environment's `bin/python` runs")
APPLICATION_ID_ENV, JOB_ROLE_ARN_ENV, BUCKET_ENV, LOG_URI_ENV = (
    APPLICATION_ID.name, JOB_ROLE_ARN.name, BUCKET.name, LOG_URI.name)


@dataclass(frozen=True)
class SparkSettings:
    """Where a partition sends: the broker of the pools (``rpc``) and the delay scheduler's input
    topic on Kafka (scheduled rows)."""

    rpc: RpcSettings
    kafka_bootstrap: str
    delay_topic: str

    @classmethod
    def from_env(cls, delay_topic: str | None = None) -> SparkSettings:
        """The job's settings; ``delay_topic`` (``--delay-topic``) wins over SWITCHYARD_DELAY_INPUT_TOPIC,
        whose delay settings are then not read at all."""
        from switchyard.delay.settings import DelaySettings
        from switchyard.rpc.settings import RpcSettings

        source = config_source()
        rpc = RpcSettings.from_env(source)
        topic = delay_topic or DelaySettings.from_env(source).input_topic
        return cls(rpc, KAFKA_BOOTSTRAP.read(source), topic)


@dataclass(frozen=True)
class EmrSettings:
    """Defaults of the EMR Serverless commands from ``SWITCHYARD_EMR_*`` / ``SWITCHYARD_PIPELINE_BUCKET``
    (flags win over them, stack outputs come after them: ``emr.resolve``)."""

    application_id: str | None = None
    job_role_arn: str | None = None
    bucket: str | None = None
    log_uri: str | None = None

    @classmethod
    def from_env(cls, source: Mapping[str, str] | None = None) -> EmrSettings:
        emr = build(cls, {"application_id": APPLICATION_ID, "job_role_arn": JOB_ROLE_ARN, "bucket": BUCKET,
                          "log_uri": LOG_URI}, source)
        return cls(emr.application_id or None, emr.job_role_arn or None, emr.bucket or None,
                   emr.log_uri or None)


def default_spark_env(name: str, value: str) -> None:
    """Set a variable Spark itself reads (the Python of its workers, its bind address) unless the
    process has it: the environment of the processes a local master starts, not a Switchyard setting."""
    os.environ.setdefault(name, value)
