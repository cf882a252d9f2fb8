"""Errors of the PySpark pipeline, under the project's SwitchyardError tree.

boto3's errors are wrapped where they happen (``store``, ``emr``, ``package``) with ``from``. The
messages name the flag or setting at fault: the command line prints them as they are.
"""

from __future__ import annotations

from switchyard.core.errors import ConfigError, SwitchyardError


class SparkError(SwitchyardError):
    """Base of the pipeline's errors."""


class PublishOptionsError(SparkError, ConfigError):
    """The publish job cannot run as asked: a format it cannot tell or does not know, an input
    without a ``key`` column (a ConfigError, as before: the message names the flag)."""


class JobStoreError(SparkError):
    """The job's input could not be read from, or its output written to, S3 (a local master's copy)."""


class EmrJobError(SparkError):
    """A job could not be submitted or followed, or it ended in a state other than SUCCESS."""


class InvalidJobInputError(EmrJobError, ValueError):
    """A flag or setting of a submission is malformed; the message names it."""


class PackagingError(EmrJobError):
    """The environment could not be built or uploaded."""
