"""The error tree of docs/errors.md, read from the classes themselves: every exception class of
``switchyard.*`` is under its part's root (the core's and the adapters' under ``SwitchyardError``),
a role several parts play has one name (the core's), the table names every class in its part's
column with one name per row, and the renamed classes still import, with a warning."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import warnings

import pytest

import switchyard
from switchyard.bus.errors import BusError
from switchyard.core import errors as core_errors
from switchyard.core.errors import SwitchyardError
from switchyard.delay.errors import DelayError
from switchyard.pending.errors import PendingError
from switchyard.spark.errors import SparkError
from tests.conftest import ROOT

ROOTS: dict[str, type[BaseException]] = {"core": SwitchyardError, "rpc": core_errors.RpcError,
                                         "delay": DelayError, "pending": PendingError, "bus": BusError,
                                         "spark": SparkError, "adapters": SwitchyardError}
# The roles several parts play: a part's class that derives from one carries its name.
ROLES = (core_errors.StoreError, core_errors.StoreUnavailableError, core_errors.BrokerError,
         core_errors.BrokerUnavailableError, core_errors.RemoteError)
# Not errors, outside the tree on purpose (docs/errors.md says why).
OUTSIDE = {"switchyard.rpc.worker.request.Requeue": "a handler's signal to give its request back",
           "switchyard.pending.api.TooManyPollsError": "Powertools' ServiceError: its 429 is the answer"}
# The old names, kept for one version (CHANGELOG.md): module -> {old: new}.
DELAY_RENAMED = {"PublishError": "BrokerError", "PublisherUnavailableError": "BrokerUnavailableError"}
RENAMED = {
    "switchyard.bus.errors": {"StorageError": "StoreError",
                              "StorageUnavailableError": "StoreUnavailableError"},
    "switchyard.pending.errors": {"QueueUnavailableError": "StoreUnavailableError"},
    "switchyard.pending": {"QueueUnavailableError": "StoreUnavailableError"},
    "switchyard.spark.errors": {"JobStoreError": "StoreError"},
    "switchyard.spark": {"JobStoreError": "StoreError"},
    "switchyard.delay.errors": DELAY_RENAMED,
    "switchyard.delay": DELAY_RENAMED,
}


def part_of(module: str) -> str:
    """The part a module belongs to: its package under ``switchyard``, the core, or an adapter."""
    name = module.split(".")[1] if module.count(".") else ""
    return name if name in ROOTS else "adapters"


def column(cls: type[BaseException]) -> str:
    """The table's column of a class: its part's, or for a part's root its part (``RpcError`` is
    declared in the core)."""
    return next((part for part, root in ROOTS.items() if root is cls and part != "adapters"),
                part_of(cls.__module__))


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of ``switchyard``, by its dotted path."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(switchyard.__path__, "switchyard."):
        if info.name.endswith("__main__"):  # runs the command line when imported
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


@pytest.fixture(scope="module")
def classes() -> dict[str, type[BaseException]]:
    found = exception_classes()
    assert len(found) > 50, sorted(found)  # the walk saw the package
    return found


def test_every_exception_class_is_under_its_parts_root(classes) -> None:
    outside = [f"{path} is not a {ROOTS[part_of(cls.__module__)].__name__}"
               for path, cls in sorted(classes.items())
               if path not in OUTSIDE and not issubclass(cls, ROOTS[part_of(cls.__module__)])]
    assert not outside, "\n".join(outside)
    assert set(OUTSIDE) <= set(classes), set(OUTSIDE) - set(classes)  # no stale exemption


def test_a_role_has_one_name(classes) -> None:
    """A part's class taken straight from a core role carries the role's name, and a part's class
    of a role's name is that role's."""
    wrong = []
    for path, cls in sorted(classes.items()):
        if part_of(cls.__module__) in ("core", "adapters"):
            continue
        wrong += [f"{path} derives from the role {role.__name__} under another name"
                  for role in ROLES if role in cls.__bases__ and cls.__name__ != role.__name__]
        wrong += [f"{path} has the name of the role {role.__name__} without deriving from it"
                  for role in ROLES if cls.__name__ == role.__name__ and not issubclass(cls, role)]
    assert not wrong, "\n".join(wrong)


def table() -> tuple[list[str], list[list[str]]]:
    """The columns and rows of docs/errors.md's table of roles (the one whose first column is ``role``)."""
    lines = (ROOT / "docs" / "errors.md").read_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| role |")))
    block = [line for line in lines[start:][:next(i for i, line in enumerate([*lines[start:], ""])
                                                   if not line.startswith("|"))]]
    header, _, *rows = ([cell.strip() for cell in line.strip().strip("|").split("|")] for line in block)
    return header, rows


def test_the_table_names_every_class_once_in_its_parts_column_one_name_a_row(classes) -> None:
    columns, (roots, *rows) = table()
    assert columns[1:] == list(ROOTS), columns
    assert roots[1:] == [f"`{root.__name__}`" if part != "adapters" else "" for part, root in ROOTS.items()]
    listed = [(part, roots[i + 1].strip("`")) for i, part in enumerate(ROOTS) if roots[i + 1]]
    for row in rows:
        names = {re.fullmatch(r"`(\w+)`", cell).group(1) for cell in row[1:] if cell}  # type: ignore[union-attr]
        assert len(names) == 1, f"one role, one name: {row}"
        listed += [(part, row[i + 1].strip("`")) for i, part in enumerate(ROOTS) if row[i + 1]]
    code = sorted((column(cls), cls.__name__) for path, cls in classes.items()
                  if path not in OUTSIDE and not cls.__name__.startswith("_"))
    assert sorted(listed) == code, {"in the table only": sorted(set(listed) - set(code)),
                                    "in the code only": sorted(set(code) - set(listed)),
                                    "twice": sorted({x for x in listed if listed.count(x) > 1})}


@pytest.mark.parametrize(("module", "old", "new"), [(m, old, new) for m, names in RENAMED.items()
                                                     for old, new in names.items()])
def test_a_renamed_class_imports_by_its_old_name_with_a_warning(module: str, old: str, new: str) -> None:
    imported = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{module}.{old} is deprecated"):
        assert getattr(imported, old) is getattr(imported, new)
    assert old not in vars(imported)  # only the alias: no class of the old name
    with warnings.catch_warnings(), pytest.raises(AttributeError):
        warnings.simplefilter("error")
        getattr(imported, f"{old}Typo")
