"""A command's services, checked before it starts: one TCP connect each, about a second at most.

Why: the clients behind the commands retry (redis-py for 30 s, librdkafka until its message
timeout, Spark after its start-up), so a service that is down showed as a long silence or a page of
driver logs. A plain connect to the configured host:port says in a second which service is
missing and which setting points at it. Only host and port are ever printed: the URLs carry
passwords, and the check reads the configured template, so no secret is fetched for it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from switchyard.core.config import (
    AMQP_URL,
    KAFKA_BOOTSTRAP,
    MANAGEMENT_URL,
    POSTGRES_DSN,
    REDIS_URL,
    Connections,
    SecretUrl,
    service_urls,
)
from switchyard.core.errors import ConfigError
from switchyard.core.reader import CONFIG_PATH

TIMEOUT_S = 1.0


class ServiceUnreachableError(ConfigError):
    """A service a command needs does not accept connections at its configured address."""


@dataclass(frozen=True)
class Service:
    label: str
    variable: str
    field: str  # the Connections field holding its address
    default_port: Callable[[str], int | None]  # scheme -> port when the address has none


SERVICES = {
    "amqp": Service("RabbitMQ", AMQP_URL.name, "amqp_url",
                    lambda scheme: 5671 if scheme == "amqps" else 5672),
    "management": Service("the RabbitMQ management API", MANAGEMENT_URL.name, "management_url",
                          lambda scheme: 443 if scheme == "https" else 80),
    "redis": Service("Redis", REDIS_URL.name, "redis_url",
                     lambda scheme: 6379 if scheme in ("redis", "rediss") else None),
    "postgres": Service("Postgres", POSTGRES_DSN.name, "postgres_dsn", lambda _scheme: 5432),
    "kafka": Service("Kafka", KAFKA_BOOTSTRAP.name, "kafka_bootstrap", lambda _scheme: 9092),
    "aws": Service("the AWS endpoint", "AWS_ENDPOINT_URL", "aws_endpoint_url",
                   lambda scheme: 443 if scheme == "https" else 80),
}


def addresses(service: Service, configured: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a configured address; empty when it is not a TCP address this
    check understands (a Unix socket, a key=value DSN without a host), which is then left to the
    client."""
    if service.field == "kafka_bootstrap":
        pairs = [item.strip().rsplit(":", 1) for item in configured.split(",") if item.strip()]
        return [(host.strip("[]"), int(port)) for host, port in pairs if port.isdigit()]
    if "://" not in configured:
        return _keyword_dsn(configured)
    if configured.count("://") > 1:  # several URLs, one per node (service_urls): any one will do
        return [pair for url in service_urls(configured) for pair in addresses(service, url)]
    parts = urlsplit(configured)
    netloc = parts.netloc.rpartition("@")[2]  # the credentials never take part
    found = []
    for hostport in netloc.split(","):  # libpq accepts host1:port1,host2:port2
        if "{" in hostport:
            continue  # a deployed template's {host}/{port}: filled from the secret, which is not read here
        host, _, port = hostport.rpartition(":") if not hostport.endswith("]") else (hostport, "", "")
        if not host or not port.isdigit():
            host, port = hostport, ""
        host = host.strip("[]")
        number = int(port) if port else service.default_port(parts.scheme)
        if host and not host.startswith("/") and number is not None:
            found.append((host, number))
    return found


def _keyword_dsn(dsn: str) -> list[tuple[str, int]]:
    """``host=... port=...`` of a libpq keyword DSN (unquoted values only)."""
    words = dict(part.split("=", 1) for part in dsn.split() if "=" in part)
    host, port = words.get("host", ""), words.get("port", "5432")
    if not host or host.startswith("/") or not port.isdigit():
        return []
    return [(host, int(port))]


def _reason(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"no answer within {TIMEOUT_S:g} s"
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    return (exc.strerror or type(exc).__name__).lower()


def reach(host: str, port: int, timeout_s: float = TIMEOUT_S) -> str | None:
    """None when ``host:port`` accepts a TCP connection within ``timeout_s``, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return _reason(exc)


def _hint(service: Service) -> str:
    if CONFIG_PATH.read(os.environ):
        return f"check the stack's {service.variable} (switchyard --stack NAME config) and the route to it"
    return (f"start {service.label} there, or set {service.variable} to where it runs (in a Switchyard "
            "checkout: ./dev services)")


def require(*names: str, connections: Connections | None = None) -> None:
    """Raise ``ServiceUnreachableError`` naming the first of ``names`` (keys of ``SERVICES``) that
    does not accept a connection; return at once when all do."""
    connections = connections or Connections.from_env()
    for name in names:
        service = SERVICES[name]
        configured = type(connections).__dict__[service.field]
        secret_url = isinstance(configured, SecretUrl)
        raw = configured.template(connections) if secret_url else getattr(connections, service.field)
        if not raw:
            continue  # e.g. no AWS_ENDPOINT_URL: the SDK's own endpoints
        if secret_url and "{" not in raw:  # a deployed template ({host}, {port}) is checked once filled
            configured.check(raw)  # malformed: its one-line ConfigError
        try:
            targets = addresses(service, raw)
        except ValueError:
            continue  # not an address this check reads: the client will say what is wrong with it
        if not targets:
            continue
        reasons = [reach(host, port) for host, port in targets]
        if all(reasons):
            where = ", ".join(_hostport(host, port) for host, port in targets)
            raise ServiceUnreachableError(f"cannot reach {service.label} at {where} ({service.variable}): "
                                          f"{reasons[0]}; {_hint(service)}")


# A driver's "cannot connect" error, by class (named, so no driver is imported to recognize it).
_DRIVER_ERRORS = {
    "redis.exceptions.ConnectionError": "redis",
    "redis.exceptions.TimeoutError": "redis",
    "redis.exceptions.InvalidResponse": "redis",  # something else answers at that address
    "pika.exceptions.AMQPConnectionError": "amqp",
    "psycopg.OperationalError": "postgres",
    "cimpl.KafkaException": "kafka",
    "botocore.exceptions.EndpointConnectionError": "aws",
}


def unavailable(exc: BaseException) -> str | None:
    """The one-line message for a driver's connection error (a service lost after the check, or
    reached by a handler whose services the command cannot know), else None."""
    for cls in type(exc).__mro__:
        name = _DRIVER_ERRORS.get(f"{cls.__module__}.{cls.__qualname__}")
        if name:
            service = SERVICES[name]
            code = getattr(exc, "reply_code", None)
            if isinstance(code, int):  # the broker answered, and closed the connection: not unavailable
                hint = (f"check the user, password and vhost in {service.variable}" if code in _REFUSED
                        else "the broker's log says why")
                said = getattr(exc, "reply_text", "")
                return f"{service.label} closed the connection ({service.variable}): {code} {said}; {hint}"
            reason = str(exc).rstrip(".")
            return f"{service.label} is unavailable ({service.variable}): {reason}; {_hint(service)}"
    return None


_REFUSED = (403, 530)  # AMQP ACCESS_REFUSED, NOT_ALLOWED (a vhost the user may not open)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
