"""Settings read from the environment, with defaults that work against the local stack.

Every variable is documented in the README's "Configuration" table; keep the two in step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from switchyard.errors import ConfigError

T = TypeVar("T")


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


@dataclass(frozen=True)
class Connections:
    """Where the backing services are. Defaults are the local stack on 127.0.0.1."""

    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/%2F"
    management_url: str = "http://guest:guest@127.0.0.1:15672"
    redis_url: str = "redis://127.0.0.1:6379/0"
    postgres_dsn: str = "postgresql://postgres@127.0.0.1:5432/switchyard"
    kafka_bootstrap: str = "127.0.0.1:9092"
    aws_endpoint_url: str | None = None
    redis_timeout_s: float = 5.0

    @classmethod
    def from_env(cls) -> Connections:
        from switchyard.aws_secrets import resolve_secrets
        from switchyard.deployed_config import load_deployed_config

        load_deployed_config()  # a deployed stack's settings from SSM, if SWITCHYARD_CONFIG_PATH is set
        resolve_secrets()  # on AWS: credentials from Secrets Manager into the URLs' placeholders
        d = cls()
        return cls(
            amqp_url=env_str("SWITCHYARD_AMQP_URL", d.amqp_url),
            management_url=env_str("SWITCHYARD_MANAGEMENT_URL", d.management_url),
            redis_url=env_str("SWITCHYARD_REDIS_URL", d.redis_url),
            postgres_dsn=env_str("SWITCHYARD_POSTGRES_DSN", d.postgres_dsn),
            kafka_bootstrap=env_str("SWITCHYARD_KAFKA_BOOTSTRAP", d.kafka_bootstrap),
            aws_endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
            redis_timeout_s=env_float("SWITCHYARD_REDIS_TIMEOUT", d.redis_timeout_s),
        )
