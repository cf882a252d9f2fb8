"""The error tree. Driver errors (pika, psycopg, redis, boto3) are wrapped at the edge with ``from``."""

from __future__ import annotations


class SwitchyardError(Exception):
    """Base of every error Switchyard raises on purpose."""


class ConfigError(SwitchyardError):
    """A setting is missing or malformed; the message names the variable."""


class InvalidNameError(SwitchyardError, ValueError):
    """A pool name, key or topic cannot be turned into a safe resource name."""


class BrokerError(SwitchyardError):
    """The message broker refused or lost an operation."""


class BrokerUnavailableError(BrokerError):
    """The broker could not be reached (connection refused, closed, timed out)."""


class TopologyError(BrokerError):
    """Exchanges, queues or policies are missing or declared differently than Switchyard expects."""


class PoolNotFoundError(TopologyError):
    """The pool was never initialized: its request exchange does not exist."""


class ManagementApiError(BrokerError):
    """The RabbitMQ management HTTP API answered with an error."""
