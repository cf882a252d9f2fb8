"""Configuration of a deployed stack, read from SSM Parameter Store into the process environment.

A deployment (the AWS target or the LocalStack one) writes each setting as a String parameter named
after its environment variable, under ``/switchyard/<stack>/config/`` (``config_path()``). A process
that has ``SWITCHYARD_CONFIG_PATH`` set (every Lambda function; ``switchyard local --stack NAME``)
reads that path with Powertools' Parameters utility, whose cache (``SWITCHYARD_CONFIG_MAX_AGE``
seconds) keeps warm invocations from calling SSM, and fills the variables the settings classes read.
Variables set in the process itself win: they are how a user overrides one setting.

Only ``SWITCHYARD_*`` names are taken, so a parameter can never set ``PATH`` or ``LD_PRELOAD``.
Secrets never sit in a parameter: URLs carry ``{username}``/``{password}`` placeholders that
``switchyard.core.aws_secrets`` fills from Secrets Manager.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import MutableMapping

from switchyard.core.errors import ConfigError

CONFIG_PATH_ENV = "SWITCHYARD_CONFIG_PATH"
CONFIG_MAX_AGE_ENV = "SWITCHYARD_CONFIG_MAX_AGE"
# Names of the stack's own resources that code reads at run time (the deployment writes them too):
ALARM_PREFIX_ENV = "SWITCHYARD_ALARM_PREFIX"  # every alarm of the stack is named {prefix}{alarm}
METRICS_NAMESPACE_ENV = "SWITCHYARD_METRICS_NAMESPACE"  # the stack's metrics: metrics_namespace(stack)
DEFAULT_METRICS_NAMESPACE = "Switchyard"  # a process of no stack (local runs, tests)
DEFAULT_MAX_AGE_S = 300
VARIABLE_RE = re.compile(r"^SWITCHYARD_[A-Z0-9_]+$")
STACK_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}$")  # CloudFormation's stack name rule

# Values this module put into the environment, by name: only those may be replaced on a refresh.
_applied: dict[str, str] = {}
_lock = threading.Lock()


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


def _max_age(environ: MutableMapping[str, str]) -> int:
    raw = environ.get(CONFIG_MAX_AGE_ENV) or str(DEFAULT_MAX_AGE_S)
    try:
        value = int(raw)
    except ValueError as exc:
        raise ConfigError(f"{CONFIG_MAX_AGE_ENV} must be a whole number of seconds, got {raw!r}") from exc
    if value < 0:
        raise ConfigError(f"{CONFIG_MAX_AGE_ENV} must be >= 0, got {value}")
    return value


def fetch(path: str, max_age: int = DEFAULT_MAX_AGE_S) -> dict[str, str]:
    """The ``SWITCHYARD_*`` parameters under ``path`` (cached by Powertools for ``max_age`` s; 0: none)."""
    from aws_lambda_powertools.utilities import parameters
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        values = parameters.get_parameters(path, recursive=False, max_age=max_age, force_fetch=max_age == 0)
    except (BotoCoreError, ClientError, parameters.GetParameterError) as exc:
        raise ConfigError(f"cannot read the deployed configuration under {path} ({exc}); check "
                          f"{CONFIG_PATH_ENV}, the stack name and the AWS endpoint") from exc
    return {name: str(value) for name, value in values.items() if VARIABLE_RE.match(name)}


def load_deployed_config(environ: MutableMapping[str, str] | None = None) -> int:
    """Fill ``environ`` (default ``os.environ``) from the path in ``SWITCHYARD_CONFIG_PATH``.

    A no-op without that variable, so local runs and tests never call AWS. Returns how many
    variables were set or refreshed.
    """
    environ = os.environ if environ is None else environ
    path = environ.get(CONFIG_PATH_ENV)
    if not path:
        return 0
    values = fetch(path, _max_age(environ))
    if not values:
        raise ConfigError(f"no configuration under {path}: is the stack deployed, and is "
                          f"{CONFIG_PATH_ENV} the path its outputs name?")
    changed = 0
    with _lock:
        for name, value in values.items():
            ours = _applied.get(name)
            if name in environ and ours is None:
                continue  # set by the process itself: the override wins
            if ours == value and name in environ:
                continue  # unchanged (the environment may hold it with its secrets filled in)
            environ[name] = value
            _applied[name] = value
            changed += 1
    return changed


def forget() -> None:
    """Drop cached parameters, secrets and clients: after the AWS endpoint changed (tests do this)."""
    from aws_lambda_powertools.utilities.parameters import base

    base.clear_caches()
    base.DEFAULT_PROVIDERS.clear()  # their boto3 clients keep the endpoint they were made with
    with _lock:
        _applied.clear()
