"""Credentials from Secrets Manager into the connection URLs, so no password sits in plain environment.

On AWS a connection URL is configured with placeholders, e.g.
``SWITCHYARD_AMQP_URL=amqps://{username}:{password}@b-1234.mq.eu-west-1.amazonaws.com:5671/%2F``,
and the values come from one of two places, per service (``AMQP``, ``POSTGRES``, ``REDIS``):

* ``SWITCHYARD_<SERVICE>_USERNAME`` / ``SWITCHYARD_<SERVICE>_PASSWORD``: injected by ECS from the
  secret's JSON keys (task definition ``secrets``), never written in the task definition;
* ``SWITCHYARD_<SERVICE>_SECRET_ARN``: a JSON secret read with Secrets Manager when the URL is
  first used, then at most once per cache max age (Lambda has no secret injection). Any JSON key
  may be a placeholder (``{host}``, ``{port}``, ``{dbname}`` of an RDS secret).

Values are percent-encoded into the URL. A URL is filled when it is read (``resolve_url``, through
``Connections``), not when the settings are built: every process may see every service's URL (the
deployed configuration holds them all), but its role may read only the secrets of the services it
uses. A URL without placeholders is left alone, so local runs never call AWS.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from string import Formatter
from urllib.parse import quote

from switchyard.core.errors import ConfigError
from switchyard.core.reader import CONFIG_MAX_AGE
from switchyard.core.settings import AMQP_URL, MANAGEMENT_URL, POSTGRES_DSN, REDIS_URL, SECRET_SOURCES

DEFAULT_MAX_AGE_S = CONFIG_MAX_AGE.default

# Service -> the variables whose placeholders its secret fills.
SECRET_URLS: dict[str, tuple[str, ...]] = {
    "AMQP": (AMQP_URL.name, MANAGEMENT_URL.name),
    "POSTGRES": (POSTGRES_DSN.name,),
    "REDIS": (REDIS_URL.name,),
}
PLACEHOLDER = re.compile(r"\{[a-z_]+\}")
INJECTED_FIELDS = ("username", "password")


def source_variable(service: str, field: str) -> str:
    """The variable of ``service``'s credential ``field`` (``secret_arn``, ``username``, ``password``)."""
    return SECRET_SOURCES[service][field].name


def source_variables(service: str) -> tuple[str, ...]:
    """Where ``service``'s credentials come from: its secret's ARN, or the values ECS injects."""
    return tuple(setting.name for setting in SECRET_SOURCES[service].values())


def secret_sources(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The credential variables of every service present in ``environ`` (default ``os.environ``):
    what ``resolve_url`` needs later, without reading any secret now."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for service in SECRET_URLS for name in source_variables(service)
            if name in environ}


def _secret_values(service: str, environ: Mapping[str, str]) -> dict[str, str]:
    # Injected values count even when empty: ECS sets exactly the secret's value.
    injected = {field: environ[source_variable(service, field)]
                for field in INJECTED_FIELDS if source_variable(service, field) in environ}
    arn = environ.get(source_variable(service, "secret_arn"))
    if not arn:
        return injected
    return {**fetch_secret(arn), **injected}


def fetch_secret(arn: str) -> dict[str, str]:
    """A JSON secret's fields, through Powertools' Parameters cache (one call per max age): the
    services' secrets, the pools custom resource's broker users, pending's endpoint tokens."""
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


def service_of(variable: str) -> str:
    """The service whose secret fills ``variable`` (``AMQP`` for ``SWITCHYARD_MANAGEMENT_URL``)."""
    for service, names in SECRET_URLS.items():
        if variable in names:
            return service
    raise ConfigError(f"{variable} is not a connection URL filled from a secret ({', '.join(SECRET_URLS)})")


def resolve_url(variable: str, value: str, sources: Mapping[str, str]) -> str:
    """``value`` of ``variable`` with its placeholders filled from its service's secret (found through
    ``sources``, see ``secret_sources``); only that one secret is read, once per cache max age."""
    if not PLACEHOLDER.search(value):
        return value
    return fill(value, _secret_values(service_of(variable), sources), variable)


def resolve_secrets(environ: MutableMapping[str, str] | None = None) -> None:
    """Fill every connection URL of ``environ`` (default ``os.environ``) in place: for an operator's
    process that may read every secret (a role reads only its own: use ``resolve_url``)."""
    environ = os.environ if environ is None else environ
    for names in SECRET_URLS.values():
        for name in names:
            if name in environ:
                environ[name] = resolve_url(name, environ[name], environ)
