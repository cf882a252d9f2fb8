"""The connections every part shares (``Connections``), their URLs checked and their secrets filled
when read, and the face of the settings reader (``switchyard.core.reader``, re-exported here).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import quote, urlsplit

from switchyard.core.aws_secrets import resolve_url, secret_sources
from switchyard.core.errors import ConfigError
from switchyard.core.reader import SETTINGS, Setting, build, config_source, declared, setting
from switchyard.core.settings import (
    AMQP_HEARTBEAT,
    AMQP_URL,
    KAFKA_AUTH,
    KAFKA_BOOTSTRAP,
    MANAGEMENT_URL,
    POSTGRES_DSN,
    REDIS_CLUSTER,
    REDIS_TIMEOUT,
    REDIS_URL,
    SECRET_SERVICES,
    SECRET_SOURCES,
)

__all__ = ["AMQP_HEARTBEAT", "AMQP_URL", "KAFKA_AUTH", "KAFKA_BOOTSTRAP", "MANAGEMENT_URL", "POSTGRES_DSN",
           "REDIS_CLUSTER", "REDIS_TIMEOUT", "REDIS_URL", "SECRET_SERVICES", "SECRET_SOURCES", "SETTINGS",
           "Connections", "SecretUrl", "Setting", "build", "config_source", "declared", "setting"]
# Kept for the code that names them (stacks/parameters.py, the tests).
REDIS_URL_ENV = REDIS_URL.name
REDIS_CLUSTER_ENV = REDIS_CLUSTER.name

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

    def __init__(self, setting: Setting[str], schemes: tuple[str, ...], conninfo: bool = False,
                 several: bool = False) -> None:
        self.setting, self.schemes, self.conninfo = setting, schemes, conninfo
        self.variable, self.default = setting.name, setting.default
        self.several = several  # a comma-separated list of a cluster's nodes (service_urls)
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Connections | None, owner: type | None = None) -> str:
        if obj is None:
            return self.default  # the dataclass's default for the field
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

    amqp_url: str = SecretUrl(AMQP_URL, ("amqp", "amqps"), several=True)  # type: ignore[assignment]
    management_url: str = SecretUrl(MANAGEMENT_URL, ("http", "https"), several=True)  # type: ignore[assignment]
    redis_url: str = SecretUrl(REDIS_URL, ("redis", "rediss", "unix"))  # type: ignore[assignment]
    postgres_dsn: str = SecretUrl(POSTGRES_DSN, ("postgresql", "postgres"),  # type: ignore[assignment]
                                  conninfo=True)
    kafka_bootstrap: str = KAFKA_BOOTSTRAP.default
    aws_endpoint_url: str | None = None
    redis_timeout_s: float = REDIS_TIMEOUT.default
    redis_cluster: bool = False  # redis_url names one node of a Redis Cluster (REDIS_CLUSTER)
    # <SERVICE>_SECRET_ARN / _USERNAME / _PASSWORD as found at start (aws_secrets.secret_sources)
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
        own = {s.name for s in SECRET_SOURCES["AMQP"].values()}
        sources = {k: v for k, v in self.secret_sources.items() if k not in own}
        values = {f.name: self._raw(f.name) for f in fields(self)}
        arn = SECRET_SOURCES["AMQP"]["secret_arn"].name
        return Connections(**{**values, "amqp_url": amqp, "secret_sources": {**sources, arn: secret_arn}})

    @classmethod
    def from_env(cls, source: Mapping[str, str] | None = None) -> Connections:
        """The connections of this process: ``source`` (default ``config_source()``: the environment
        over a deployed stack's configuration). Reads no secret (see ``SecretUrl``)."""
        source = config_source() if source is None else source
        return build(cls, CONNECTIONS, source, aws_endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
                     secret_sources=secret_sources(source))


CONNECTIONS: dict[str, Setting[Any]] = {
    "amqp_url": AMQP_URL, "management_url": MANAGEMENT_URL, "redis_url": REDIS_URL,
    "postgres_dsn": POSTGRES_DSN, "kafka_bootstrap": KAFKA_BOOTSTRAP, "redis_timeout_s": REDIS_TIMEOUT,
    "redis_cluster": REDIS_CLUSTER,
}
