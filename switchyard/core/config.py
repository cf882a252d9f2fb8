"""Settings read from the environment, with defaults that work against the local stack.

Every variable is documented in docs/configuration.md; keep the two in step.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from switchyard.core.errors import ConfigError

T = TypeVar("T")

# The Redis settings every Redis user reads, named once (the CDK stack writes them: stacks/parameters.py).
REDIS_URL_ENV = "SWITCHYARD_REDIS_URL"
REDIS_CLUSTER_ENV = "SWITCHYARD_REDIS_CLUSTER"  # 1: REDIS_URL_ENV names one node of a Redis Cluster


def env_str(name: str, default: str) -> str:
    value = os.environ.get(name)
    return default if value is None or value == "" else value


def _env_number(name: str, default: T, cast: Callable[[str], T], kind: str) -> T:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} must be {kind}, got {raw!r}") from exc


def env_int(name: str, default: int) -> int:
    return _env_number(name, default, int, "an integer")


def env_float(name: str, default: float) -> float:
    return _env_number(name, default, float, "a number")


def env_flag(name: str) -> bool:
    """``1`` on, ``0`` or unset off; anything else is a ConfigError (a typo must not mean off)."""
    raw = os.environ.get(name, "")
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{name} must be 1 or 0, got {raw!r}")
    return raw == "1"


def fields_from_env(cls: Callable[..., T], variables: Mapping[str, str], **fixed: Any) -> T:
    """``cls`` with each field of ``variables`` (field -> variable) read from the environment and
    parsed like its default (int, float or str); the other fields keep their defaults, ``fixed``
    ones are passed as given. One reader for every settings class, so all parse alike."""
    defaults = cls()
    values: dict[str, Any] = {}
    for name, variable in variables.items():
        default = getattr(defaults, name)
        if isinstance(default, bool):
            raise TypeError(f"{name}: booleans need an explicit rule, not {variable}")
        reader = env_int if isinstance(default, int) else env_float if isinstance(default, float) else env_str
        values[name] = reader(variable, default)
    return cls(**values, **fixed)


def prefixed(prefix: str, *names: str) -> dict[str, str]:
    """``{field: PREFIX + FIELD}`` for ``fields_from_env``."""
    return {name: prefix + name.upper() for name in names}


_URL_LIST_SPLIT = re.compile(r",\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")


def service_urls(value: str) -> list[str]:
    """The URLs of a setting that may name several nodes of one cluster, comma-separated (a RabbitMQ
    cluster without a load balancer in front: each client tries them in turn). A comma splits only
    where a URL begins after it, so a password may hold one."""
    return [url.strip() for url in _URL_LIST_SPLIT.split(value) if url.strip()]


@functools.lru_cache(maxsize=32)
def check_service_urls(variable: str, value: str, schemes: tuple[str, ...]) -> str:
    """``value``, a comma-separated list of URLs of one cluster's nodes, each checked."""
    urls = service_urls(value)
    if not urls:
        raise ConfigError(f"{variable} is empty; expected {schemes[0]}://host:port/... "
                          "(a cluster's nodes: several, comma-separated)")
    for url in urls:
        check_service_url(variable, url, schemes)
    return value


@functools.lru_cache(maxsize=32)
def check_service_url(variable: str, url: str, schemes: tuple[str, ...], conninfo: bool = False) -> str:
    """``url`` if it reads as a URL of one of ``schemes`` (``conninfo``: libpq's key=value form is
    accepted too), else a ConfigError naming ``variable``.

    Why here: each client library fails on a malformed URL in its own way (pika, redis-py and the
    standard library raise ValueError or IndexError from deep inside), which reached the user as an
    "unexpected" error. The message leaves the URL out: it may hold a password.
    """
    if conninfo and "://" not in url:
        return url  # libpq's key=value form (host=... dbname=...): psycopg reads and checks it
    expected = f"expected {schemes[0]}://host:port/..., with user and password before the host"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (reading it checks it: a port that is not a number in 0-65535 raises)
    except ValueError as exc:
        raise ConfigError(f"{variable} cannot be read as a URL ({exc}); {expected}") from None
    if parts.scheme not in schemes:
        raise ConfigError(f"{variable} must begin with {' or '.join(f'{s}://' for s in schemes)}, "
                          f"got {parts.scheme + '://' if parts.scheme else 'no scheme'}; {expected}")
    return url


class SecretUrl:
    """A ``Connections`` URL field whose ``{placeholders}`` are filled from its service's secret when
    it is read, not when the settings are built.

    Why: a deployed process sees every service's URL (the stack's configuration holds them all),
    but its role may read only the secrets of the services it uses; a broker-only function that
    built its settings eagerly would fail AccessDenied on the Redis and Postgres secrets. The
    stored value stays the template, so settings can be pickled (Spark ships them to executors)
    and printed without a password they never had.
    """

    def __init__(self, variable: str, default: str, schemes: tuple[str, ...], conninfo: bool = False,
                 several: bool = False) -> None:
        self.variable, self.default, self.schemes, self.conninfo = variable, default, schemes, conninfo
        self.several = several  # a comma-separated list of a cluster's nodes (service_urls)
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Connections | None, owner: type | None = None) -> str:
        if obj is None:
            return self.default  # the dataclass's default for the field
        from switchyard.core.aws_secrets import resolve_url

        url = resolve_url(self.variable, obj.__dict__[self.name], obj.secret_sources)
        return self.check(url)

    def check(self, url: str) -> str:
        """``url`` checked as this field's value (``check_service_url``, each of a list)."""
        if self.several:
            return check_service_urls(self.variable, url, self.schemes)
        return check_service_url(self.variable, url, self.schemes, self.conninfo)

    def __set__(self, obj: Connections, value: str) -> None:
        obj.__dict__[self.name] = value

    def template(self, obj: Connections) -> str:
        """The value as configured, placeholders unfilled (no secret is read)."""
        return obj.__dict__[self.name]


@dataclass(frozen=True)
class Connections:
    """Where the backing services are. Defaults are the local stack on 127.0.0.1.

    The URL fields of services with a secret (AMQP, management, Redis, Postgres) are ``SecretUrl``:
    reading one fills it from that service's secret, named in ``secret_sources``; unread, nothing is
    fetched. ``repr`` shows the templates, so it never triggers (or prints) a secret;
    ``dataclasses.replace`` reads (and so fills) every field it copies.
    """

    amqp_url: str = SecretUrl("SWITCHYARD_AMQP_URL",  # type: ignore[assignment]
                              "amqp://guest:guest@127.0.0.1:5672/%2F", ("amqp", "amqps"), several=True)
    management_url: str = SecretUrl("SWITCHYARD_MANAGEMENT_URL",  # type: ignore[assignment]
                                    "http://guest:guest@127.0.0.1:15672", ("http", "https"), several=True)
    redis_url: str = SecretUrl(REDIS_URL_ENV,  # type: ignore[assignment]
                               "redis://127.0.0.1:6379/0", ("redis", "rediss", "unix"))
    postgres_dsn: str = SecretUrl("SWITCHYARD_POSTGRES_DSN",  # type: ignore[assignment]
                                  "postgresql://postgres@127.0.0.1:5432/switchyard",
                                  ("postgresql", "postgres"), conninfo=True)
    kafka_bootstrap: str = "127.0.0.1:9092"
    aws_endpoint_url: str | None = None
    redis_timeout_s: float = 5.0
    redis_cluster: bool = False  # SWITCHYARD_REDIS_URL names one node of a Redis Cluster
    # SWITCHYARD_<SERVICE>_SECRET_ARN / _USERNAME / _PASSWORD as found at start (aws_secrets.secret_sources)
    secret_sources: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={self._raw(f.name)!r}" for f in fields(self) if f.repr)
        return f"Connections({shown})"

    def _raw(self, name: str) -> Any:
        attribute = type(self).__dict__.get(name)
        return attribute.template(self) if isinstance(attribute, SecretUrl) else getattr(self, name)

    def as_amqp_user(self, vhost: str, secret_arn: str) -> Connections:
        """These connections with the broker's AMQP URL in ``vhost`` and the AMQP URLs filled from
        another user's secret, ``secret_arn`` (one process, a second broker identity). Nothing is read."""
        amqp = urlsplit(self._raw("amqp_url"))._replace(path="/" + quote(vhost, safe="")).geturl()
        sources = {k: v for k, v in self.secret_sources.items() if not k.startswith("SWITCHYARD_AMQP_")}
        values = {f.name: self._raw(f.name) for f in fields(self)}
        return Connections(**{**values, "amqp_url": amqp,
                              "secret_sources": {**sources, "SWITCHYARD_AMQP_SECRET_ARN": secret_arn}})

    @classmethod
    def from_env(cls) -> Connections:
        """The connections of this process: a deployed stack's configuration (SSM, when
        ``SWITCHYARD_CONFIG_PATH`` is set), then the environment. Reads no secret (see ``SecretUrl``)."""
        from switchyard.core.aws_secrets import secret_sources
        from switchyard.core.deployed_config import load_deployed_config

        load_deployed_config()
        d = cls()
        return cls(
            amqp_url=env_str("SWITCHYARD_AMQP_URL", d.amqp_url),
            management_url=env_str("SWITCHYARD_MANAGEMENT_URL", d.management_url),
            redis_url=env_str(REDIS_URL_ENV, d.redis_url),
            postgres_dsn=env_str("SWITCHYARD_POSTGRES_DSN", d.postgres_dsn),
            kafka_bootstrap=env_str("SWITCHYARD_KAFKA_BOOTSTRAP", d.kafka_bootstrap),
            aws_endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
            redis_timeout_s=env_float("SWITCHYARD_REDIS_TIMEOUT", d.redis_timeout_s),
            redis_cluster=env_flag(REDIS_CLUSTER_ENV),
            secret_sources=secret_sources(),
        )
