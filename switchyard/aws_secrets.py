"""Credentials from Secrets Manager into the connection URLs, so no password sits in plain environment.

On AWS a connection URL is configured with placeholders, e.g.
``SWITCHYARD_AMQP_URL=amqps://{username}:{password}@b-1234.mq.eu-west-1.amazonaws.com:5671/%2F``,
and the values come from one of two places, per service (``AMQP``, ``POSTGRES``, ``REDIS``):

* ``SWITCHYARD_<SERVICE>_USERNAME`` / ``SWITCHYARD_<SERVICE>_PASSWORD``: injected by ECS from the
  secret's JSON keys (task definition ``secrets``), never written in the task definition;
* ``SWITCHYARD_<SERVICE>_SECRET_ARN``: a JSON secret read once per process with Secrets Manager
  (Lambda has no secret injection). Any JSON key may be a placeholder (``{host}``, ``{port}``,
  ``{dbname}`` of an RDS secret).

Values are percent-encoded into the URL. ``resolve_secrets()`` is called by
``Connections.from_env()``; a URL without placeholders is left alone, so local runs never call AWS.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from string import Formatter
from urllib.parse import quote

from switchyard.deployed_config import DEFAULT_MAX_AGE_S
from switchyard.errors import ConfigError

# Service -> the variables whose placeholders its secret fills.
SECRET_URLS: dict[str, tuple[str, ...]] = {
    "AMQP": ("SWITCHYARD_AMQP_URL", "SWITCHYARD_MANAGEMENT_URL"),
    "POSTGRES": ("SWITCHYARD_POSTGRES_DSN",),
    "REDIS": ("SWITCHYARD_REDIS_URL",),
}
PLACEHOLDER = re.compile(r"\{[a-z_]+\}")


def _secret_values(service: str, environ: MutableMapping[str, str]) -> dict[str, str]:
    injected = {field: environ[f"SWITCHYARD_{service}_{field.upper()}"]
                for field in ("username", "password") if environ.get(f"SWITCHYARD_{service}_{field.upper()}")}
    arn = environ.get(f"SWITCHYARD_{service}_SECRET_ARN")
    if not arn:
        return injected
    return {**_fetch(arn), **injected}


def _fetch(arn: str) -> dict[str, str]:
    """The secret's JSON object, through Powertools' Parameters cache (one call per max age)."""
    from aws_lambda_powertools.utilities import parameters
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        values = parameters.get_secret(arn, transform="json", max_age=DEFAULT_MAX_AGE_S)
    except (BotoCoreError, ClientError, parameters.GetParameterError) as exc:
        raise ConfigError(f"cannot read secret {arn}: {exc}") from exc
    except parameters.TransformParameterError as exc:
        raise ConfigError(f"secret {arn} is not a JSON object with a SecretString") from exc
    if not isinstance(values, dict):
        raise ConfigError(f"secret {arn} is not a JSON object")
    return {str(k): str(v) for k, v in values.items()}


def fill(template: str, values: dict[str, str], name: str) -> str:
    """``template`` with each ``{field}`` replaced by the percent-encoded value."""
    fields = {f for _, f, _, _ in Formatter().parse(template) if f}
    missing = sorted(fields - values.keys())
    if missing:
        raise ConfigError(f"{name} needs {', '.join(missing)} from its secret, which has only "
                          f"{', '.join(sorted(values)) or 'nothing'}")
    return template.format(**{f: quote(values[f], safe="") for f in fields})


def resolve_secrets(environ: MutableMapping[str, str] | None = None) -> None:
    """Fill the placeholders of every connection URL in ``environ`` (default ``os.environ``) in place."""
    environ = os.environ if environ is None else environ
    for service, names in SECRET_URLS.items():
        templated = [n for n in names if PLACEHOLDER.search(environ.get(n, ""))]
        if not templated:
            continue
        values = _secret_values(service, environ)
        for name in templated:
            environ[name] = fill(environ[name], values, name)
