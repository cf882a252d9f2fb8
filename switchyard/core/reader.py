"""The one reader of Switchyard's settings: a ``Setting`` per variable, and where values come from.

Every ``SWITCHYARD_*`` variable is declared once, as a ``Setting`` (name, type, unit, default, doc),
beside the settings class it fills: the core's in ``switchyard.core.settings`` (and the two the reader
itself needs, here), each part's in its ``settings.py``. Every value is read through ``Setting.read``,
from the process environment over the deployed stack's configuration (``config_source``), which is
passed as values and never written into the environment, so no reader depends on who ran first.
``docs/configuration.md``'s table is generated from the declarations (``python -m scripts.config_docs``);
a test fails when the two differ. A renamed variable lists its old name in ``old``: read with a warning
for one version.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections import ChainMap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from switchyard.core.errors import ConfigError

T = TypeVar("T")
D = TypeVar("D")

# Every declared setting by name, and every old name by the new one's setting (``Setting``).
SETTINGS: dict[str, Setting[Any]] = {}
_OLD_NAMES: dict[str, Setting[Any]] = {}
_warned: set[str] = set()
UNITS = {"s": "seconds", "ms": "milliseconds", "bytes": "bytes", "": ""}


def _flag(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError("must be 1 or 0")
    return raw == "1"


def _names(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _parser(default: object) -> tuple[Callable[[str], Any], str]:
    """How a setting is parsed, from the type of its default: flags, lists, numbers, text."""
    if isinstance(default, bool):
        return _flag, "1 or 0"
    if isinstance(default, tuple):
        return _names, "a comma-separated list"
    if isinstance(default, int):
        return int, "an integer"
    if isinstance(default, float):
        return float, "a number"
    return str, "text"


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One variable: its name, default (whose type says how the text is parsed: ``bool`` is
    ``1``/``0``, ``tuple`` a comma-separated list), unit (``s``, ``ms``, ``bytes``: the name ends in
    it), the docs' row (``doc``, and ``shown`` for the default column when it is not the value
    itself), and the names it had before (``old``). Declaring one registers it: a name is declared once.
    """

    name: str
    default: T
    doc: str
    unit: str = ""
    shown: str | None = None
    old: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()  # text settings: the values allowed
    row: str | None = None  # the docs' row name, when one row documents several settings
    documented: bool = True  # False: a setting the table already shows in another one's row
    module: str = field(default="", compare=False, repr=False)  # where it is declared (the docs' order)

    def __post_init__(self) -> None:
        if not self.module:  # the declaring module: __post_init__ <- __init__ <- the declaration
            object.__setattr__(self, "module", sys._getframe(2).f_globals.get("__name__", ""))
        if self.unit not in UNITS:
            raise ValueError(f"{self.name}: unit {self.unit!r} is not one of {sorted(UNITS)}")
        for name in (self.name, *self.old):
            if name in SETTINGS or name in _OLD_NAMES:
                raise ValueError(f"{name} is declared twice")
        SETTINGS[self.name] = self
        _OLD_NAMES.update(dict.fromkeys(self.old, self))

    def raw(self, source: Mapping[str, str] | None = None) -> str | None:
        """The text set for this setting, None when unset or empty. Each layer of ``source`` (the
        process environment, then the deployed configuration) is asked for the name, then its old
        names (with a warning), so an override under an old name still wins over the deployment."""
        source = config_source() if source is None else source
        for layer in (source.maps if isinstance(source, ChainMap) else [source]):
            value = layer.get(self.name)
            if value:
                return value
            for old in self.old:
                value = layer.get(old)
                if value:
                    _warn_renamed(old, self.name)
                    return value
        return None

    def read(self, source: Mapping[str, str] | None = None) -> T:
        """The value from ``source`` (default ``config_source()``), parsed; the default when unset.
        A value that does not parse is a ConfigError naming the variable (a typo must not mean off)."""
        raw = self.raw(source)
        if raw is None:
            return self.default
        parse, kind = _parser(self.default)
        try:
            value = parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{self.name} must be {kind}, got {raw!r}") from exc
        if self.choices and value not in self.choices:
            raise ConfigError(f"{self.name} must be one of {', '.join(self.choices)}, got {raw!r}")
        return value

    def text(self, value: object) -> str:
        """``value`` as this variable's text (what a deployment writes): ``1``/``0``, a list joined."""
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, tuple):
            return ",".join(value)
        return str(value)


def _warn_renamed(old: str, new: str) -> None:
    if old not in _warned:
        _warned.add(old)
        warnings.warn(f"{old} is renamed {new}; the old name is read for one more version "
                      "(see CHANGELOG.md)", FutureWarning, stacklevel=4)


def config_source(environ: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """Where settings are read: the process environment (``environ``, default ``os.environ``) over
    the deployed stack's configuration, passed as values (``deployed_values``), never copied into the
    environment: so every reader sees it, whatever ran first."""
    environ = os.environ if environ is None else environ
    deployed = deployed_values(environ)
    return ChainMap(dict(environ), deployed) if deployed else environ


def build(cls: Callable[..., D], spec: Mapping[str, Setting[Any]], source: Mapping[str, str] | None = None,
          **fixed: Any) -> D:
    """``cls`` with each field of ``spec`` (field -> setting) read from ``source``; ``fixed`` fields
    passed as given, the others keep their defaults. Every settings class is built here."""
    source = config_source() if source is None else source
    return cls(**{name: setting.read(source) for name, setting in spec.items()}, **fixed)


def declared() -> Iterator[Setting[Any]]:
    """Every declared setting, in declaration order (the docs' table order)."""
    return iter(list(SETTINGS.values()))


def setting(name: str) -> Setting[Any]:
    """The declared setting ``name`` (or the one an old name now reads)."""
    found = SETTINGS.get(name) or _OLD_NAMES.get(name)
    if found is None:
        raise KeyError(f"{name} is not a declared setting")
    return found


# -- the deployed configuration ------------------------------------------------------------------
# A deployment writes each setting as an SSM String parameter named after its variable, under
# /switchyard/<stack>/config/ (switchyard.core.deployed_config.config_path). Only SWITCHYARD_* names
# are taken, so a parameter can never set PATH or LD_PRELOAD; secrets never sit in a parameter.
CONFIG_PATH = Setting(
    "SWITCHYARD_CONFIG_PATH", "",
    "an SSM path (`/switchyard/<stack>/config/`) whose `SWITCHYARD_*` parameters fill the unset variables "
    "of this table; set on every deployed function, and by `switchyard --stack NAME`", shown="unset")
CONFIG_MAX_AGE = Setting(
    "SWITCHYARD_CONFIG_MAX_AGE_S", 300,
    "seconds the deployed parameters and secrets are cached (Powertools Parameters) before they are read "
    "again; `0`: every time", unit="s", old=("SWITCHYARD_CONFIG_MAX_AGE",))
VARIABLE_RE = re.compile(r"^SWITCHYARD_[A-Z0-9_]+$")


def _max_age(environ: Mapping[str, str]) -> int:
    value: int = CONFIG_MAX_AGE.read(environ)
    if value < 0:
        raise ConfigError(f"{CONFIG_MAX_AGE.name} must be >= 0, got {value}")
    return value


def fetch(path: str, max_age: int = CONFIG_MAX_AGE.default) -> dict[str, str]:
    """The ``SWITCHYARD_*`` parameters under ``path`` (cached by Powertools for ``max_age`` s; 0: none)."""
    from aws_lambda_powertools.utilities import parameters
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        values = parameters.get_parameters(path, recursive=False, max_age=max_age, force_fetch=max_age == 0)
    except (BotoCoreError, ClientError, parameters.GetParameterError) as exc:
        raise ConfigError(f"cannot read the deployed configuration under {path} ({exc}); check "
                          f"{CONFIG_PATH.name}, the stack name and the AWS endpoint") from exc
    return {name: str(value) for name, value in values.items() if VARIABLE_RE.match(name)}


def deployed_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The deployed configuration named by ``SWITCHYARD_CONFIG_PATH`` in ``environ`` (default
    ``os.environ``), as values: ``config_source`` puts them under the environment.

    Empty without that variable, so local runs and tests never call AWS. Powertools' cache keeps
    warm calls from reaching SSM (``SWITCHYARD_CONFIG_MAX_AGE_S``).
    """
    environ = os.environ if environ is None else environ
    path = CONFIG_PATH.read(environ)
    if not path:
        return {}
    values = fetch(path, _max_age(environ))
    if not values:
        raise ConfigError(f"no configuration under {path}: is the stack deployed, and is "
                          f"{CONFIG_PATH.name} the path its outputs name?")
    return values
