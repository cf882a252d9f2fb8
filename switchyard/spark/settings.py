"""Settings of the publish job and of its EMR Serverless commands, read once from the environment.

The only module of ``switchyard.spark`` that reads ``os.environ``. ``SparkSettings`` is what the job
needs to reach the pools and the delay scheduler (read on the driver, then shipped to the tasks
with the partition's publisher); ``EmrSettings`` the defaults of ``switchyard spark submit`` /
``package``. Neither imports ``switchyard.rpc`` at import time (it brings pika along), so the
command line loads without it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from switchyard.core.config import Connections

if TYPE_CHECKING:
    from switchyard.rpc.settings import RpcSettings

APPLICATION_ID_ENV = "SWITCHYARD_EMR_APPLICATION_ID"
JOB_ROLE_ARN_ENV = "SWITCHYARD_EMR_JOB_ROLE_ARN"
BUCKET_ENV = "SWITCHYARD_PIPELINE_BUCKET"
LOG_URI_ENV = "SWITCHYARD_EMR_LOG_URI"


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

        rpc = RpcSettings.from_env()
        bootstrap = Connections.from_env().kafka_bootstrap
        return cls(rpc, bootstrap, delay_topic or DelaySettings.from_env().input_topic)


@dataclass(frozen=True)
class EmrSettings:
    """Defaults of the EMR Serverless commands from ``SWITCHYARD_EMR_*`` / ``SWITCHYARD_PIPELINE_BUCKET``
    (flags win over them, stack outputs come after them: ``emr.resolve``)."""

    application_id: str | None = None
    job_role_arn: str | None = None
    bucket: str | None = None
    log_uri: str | None = None

    @classmethod
    def from_env(cls) -> EmrSettings:
        def get(name: str) -> str | None:
            return os.environ.get(name) or None

        return cls(get(APPLICATION_ID_ENV), get(JOB_ROLE_ARN_ENV), get(BUCKET_ENV), get(LOG_URI_ENV))


def default_spark_env(name: str, value: str) -> None:
    """Set a variable Spark itself reads (the Python of its workers, its bind address) unless the
    process has it: the environment of the processes a local master starts, not a Switchyard setting."""
    os.environ.setdefault(name, value)
