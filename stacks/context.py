"""Reading CDK context: a value the deployment cannot use fails synth in one line that names its key
(``ConfigError``), and ``switchyard:parts``, the parts a stack deploys."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, TypeVar

from stacks import constants
from switchyard.core import errors
from switchyard.core.errors import InvalidNameError

T = TypeVar("T")


class ConfigError(errors.ConfigError, ValueError):
    """A context value the deployment cannot use; the message names the key and what to write.

    The core's ``ConfigError`` (a setting the process cannot use), and a ``ValueError`` as the
    validators' errors are, so one ``except ValueError`` in parsing turns both into this."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def from_json(raw: str, where: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from exc


def build(cls: type[T], raw: Any, where: str) -> T:
    """``cls`` from a JSON object whose keys are the camelCase field names; unknown keys are errors."""
    if raw is None:
        raw = {}
    if isinstance(raw, str):  # -c switchyard:delay='{"partitions": 6}'
        raw = from_json(raw, where)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(raw).__name__}")
    by_key = {_camel(f.name): f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(by_key))
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {unknown}; known: {sorted(by_key)}")
    values = {}
    for key, value in raw.items():
        default = getattr(cls, by_key[key].name, None)
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ConfigError(f"{where}.{key} must be true or false, got {value!r}")
        if (
            isinstance(default, int)
            and not isinstance(default, bool)
            and (isinstance(value, bool) or not isinstance(value, int))
        ):
            raise ConfigError(f"{where}.{key} must be an integer, got {value!r}")
        values[by_key[key].name] = value
    try:
        return cls(**values)
    except InvalidNameError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def check(ok: bool, where: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {message}")


def flag(raw: Any, where: str) -> bool:
    """A boolean from cdk.json (true) or the command line (-c key=true arrives as a string)."""
    if raw is None or isinstance(raw, bool):
        return bool(raw)
    check(str(raw).lower() in ("true", "false"), where, f"must be true or false, got {raw!r}")
    return str(raw).lower() == "true"


def count(raw: Any, where: str, default: int) -> int:
    """An integer from cdk.json or the command line (a string there)."""
    if raw is None:
        return default
    check(str(raw).isdigit(), where, f"must be a whole number, got {raw!r}")
    return int(raw)


def parse_parts(raw: Any) -> frozenset[str]:
    """``switchyard:parts``: a list (or a comma-separated string) of part names, each part's needs
    chosen too; unset: every part."""
    where = constants.CTX_PARTS
    if raw in (None, ""):
        return frozenset(constants.PARTS)
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.lstrip().startswith("[") else raw.split(",")
        except ValueError as exc:
            raise ConfigError(f"{where}: not valid JSON ({exc})") from exc
    check(isinstance(raw, list) and bool(raw), where,
           f"must be a list of parts from {list(constants.PARTS)}, got {raw!r}")
    names = [str(name).strip() for name in raw]
    unknown = sorted(set(names) - set(constants.PARTS))
    check(not unknown, where, f"unknown part(s) {unknown}; the parts: {list(constants.PARTS)}")
    chosen = frozenset(names)
    for part, (needs, why) in constants.PART_NEEDS.items():
        missing = [need for need in needs if need not in chosen]
        check(part not in chosen or not missing, where,
               f"{part} needs {' and '.join(needs)} ({why}): add {', '.join(missing)}, or leave {part} out")
    return chosen
