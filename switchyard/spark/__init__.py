"""The PySpark pipeline: publish requests in bulk (calls to worker pools, or delay-scheduled).

``rows``, ``calls``, ``schedule`` and ``service`` are plain Python (they run inside Spark tasks);
only ``job`` imports pyspark (requirements-spark.txt), so the rest of Switchyard never needs it,
and this face re-exports nothing that loads it, nor a broker driver (``rows`` loads pika through
``switchyard.rpc``). ``job`` is the job itself
(``switchyard.spark.job.run`` / ``main``); ``store`` its S3 input and output on a local master;
``emr`` and ``package`` run it on EMR Serverless.
"""

from switchyard.core.errors import deprecated_aliases
from switchyard.spark.errors import (
    EmrJobError,
    InvalidJobInputError,
    PackagingError,
    PublishOptionsError,
    SparkError,
    StoreError,
)
from switchyard.spark.settings import EmrSettings, SparkSettings

__all__ = [
    "EmrJobError",
    "EmrSettings",
    "InvalidJobInputError",
    "PackagingError",
    "PublishOptionsError",
    "SparkError",
    "SparkSettings",
    "StoreError",
]

# The name before the error tree had one name per role (CHANGELOG.md), for one version.
__getattr__ = deprecated_aliases(__name__, {"JobStoreError": StoreError})
