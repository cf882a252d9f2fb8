"""Errors of the PySpark pipeline, all under its root ``SparkError``.

boto3's errors are wrapped where they happen (``store``, ``emr``, ``package``) with ``from``. The
messages name the flag or setting at fault: the command line prints them as they are.
"""

from __future__ import annotations

from switchyard.core import errors as core_errors
from switchyard.core.errors import ConfigError, SwitchyardError, deprecated_aliases


class SparkError(SwitchyardError):
    """Base of the pipeline's errors."""


class PublishOptionsError(SparkError, ConfigError):
    """The publish job cannot run as asked: a format it cannot tell or does not know, an input
    without a ``key`` column (a ConfigError, as before: the message names the flag)."""


class StoreError(SparkError, core_errors.StoreError):
    """The job's input could not be read from, or its output written to, S3 (a local master's copy)."""


class EmrJobError(SparkError):
    """A job could not be submitted or followed, or it ended in a state other than SUCCESS."""


class InvalidJobInputError(EmrJobError, ValueError):
    """A flag or setting of a submission is malformed; the message names it."""


class PackagingError(EmrJobError):
    """The environment could not be built or uploaded."""


# The name before the error tree had one name per role (CHANGELOG.md), for one version.
__getattr__ = deprecated_aliases(__name__, {"JobStoreError": StoreError})
