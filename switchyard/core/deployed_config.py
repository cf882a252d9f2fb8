"""Configuration of a deployed stack: its SSM path and names (the reading is the settings reader's,
``switchyard.core.reader.deployed_values``, re-exported here).

A deployment (the AWS target or the LocalStack one) writes each setting as a String parameter named
after its environment variable, under ``/switchyard/<stack>/config/`` (``config_path()``). A process
that has ``SWITCHYARD_CONFIG_PATH`` set (every Lambda function; ``switchyard local --stack NAME``)
reads that path with Powertools' Parameters utility, whose cache (``SWITCHYARD_CONFIG_MAX_AGE_S``
seconds) keeps warm invocations from calling SSM. The values are handed to the settings reader
(``switchyard.core.config.config_source``) under the process environment, never written into it, so
no reader depends on who loaded them first. Variables set in the process itself win: they are how a
user overrides one setting.

Only ``SWITCHYARD_*`` names are taken, so a parameter can never set ``PATH`` or ``LD_PRELOAD``.
Secrets never sit in a parameter: URLs carry ``{username}``/``{password}`` placeholders that
``switchyard.core.aws_secrets`` fills from Secrets Manager.
"""

from __future__ import annotations

import re

from switchyard.core.errors import ConfigError
from switchyard.core.reader import CONFIG_MAX_AGE, CONFIG_PATH, VARIABLE_RE, deployed_values, fetch
from switchyard.core.settings import ALARM_PREFIX, METRICS_NAMESPACE

__all__ = ["ALARM_PREFIX_ENV", "CONFIG_MAX_AGE_ENV", "CONFIG_PATH_ENV", "DEFAULT_MAX_AGE_S",
           "DEFAULT_METRICS_NAMESPACE", "METRICS_NAMESPACE_ENV", "STACK_NAME_RE", "VARIABLE_RE",
           "config_path", "deployed_values", "fetch", "forget", "metrics_namespace"]

CONFIG_PATH_ENV = CONFIG_PATH.name
CONFIG_MAX_AGE_ENV = CONFIG_MAX_AGE.name
# Names of the stack's own resources that code reads at run time (the deployment writes them too):
ALARM_PREFIX_ENV = ALARM_PREFIX.name  # every alarm of the stack is named {prefix}{alarm}
METRICS_NAMESPACE_ENV = METRICS_NAMESPACE.name  # the stack's metrics: metrics_namespace(stack)
DEFAULT_METRICS_NAMESPACE = "Switchyard"  # a process of no stack (local runs, tests)
DEFAULT_MAX_AGE_S = CONFIG_MAX_AGE.default
STACK_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}$")  # CloudFormation's stack name rule


def config_path(stack_name: str) -> str:
    """The SSM path holding ``stack_name``'s configuration (the deploy side writes the same)."""
    if not STACK_NAME_RE.match(stack_name):
        raise ConfigError(f"invalid stack name {stack_name!r}: letters, digits and hyphens, "
                          "starting with a letter, at most 128 characters")
    return f"/switchyard/{stack_name}/config/"


def metrics_namespace(stack_name: str) -> str:
    """The stack's own CloudWatch namespace: two stacks in one account (staging beside production)
    emit the same metric names and dimensions, so each stack's alarms must read its own namespace."""
    return f"{DEFAULT_METRICS_NAMESPACE}/{stack_name}"


def forget() -> None:
    """Drop cached parameters, secrets and clients: after the AWS endpoint changed (tests do this)."""
    from aws_lambda_powertools.utilities.parameters import base

    base.clear_caches()
    base.DEFAULT_PROVIDERS.clear()  # their boto3 clients keep the endpoint they were made with
