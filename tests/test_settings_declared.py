"""The configuration contract is written once: each ``SWITCHYARD_*`` name in a declaration
(``switchyard.core.reader.Setting``), read by the one reader, and the docs' table generated from them.

Names appear in code as string literals only in the declaring modules; everything else (the parts'
messages, ``stacks/``'s environments, the functions) takes ``Setting.name``. Docstrings and comments
are prose and may name variables. ``scripts/``, ``tests/``, ``bench/`` and ``dev`` are left out: they are
the development harness, whose own variables (the second table of docs/configuration.md) are read by
shell scripts and fixtures, never by a deployed process.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections import ChainMap
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

from scripts import config_docs
from switchyard.core import reader
from switchyard.core.errors import ConfigError
from switchyard.core.reader import Setting, build, declared, setting

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("switchyard", "stacks", "functions")
# A name, not a family in prose (``SWITCHYARD_DELAY_*``); a prefix an f-string completes counts.
NAME = re.compile(r"SWITCHYARD_[A-Z][A-Z0-9_]*(?![A-Z0-9_*])")
# Names of that form that are not settings of a process, each with what it is.
NOT_SETTINGS = {"SWITCHYARD_IMAGE": "the Docker build argument of a pool's image (stacks/base_image.py)"}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def literal_names(source: str) -> Iterator[tuple[int, str]]:
    """(line, name) of every ``SWITCHYARD_*`` name in a string literal of ``source`` that is not a
    docstring (f-strings' literal parts included)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            for name in NAME.findall(node.value):
                yield node.lineno, name


def literals_outside_declarations(root: Path = ROOT) -> list[str]:
    allowed = {Path(m.replace(".", "/") + ".py") for m in config_docs.DECLARING_MODULES}
    found = []
    for top in CHECKED:
        for path in sorted((root / top).rglob("*.py")):
            relative = path.relative_to(root)
            if relative in allowed or "__pycache__" in path.parts:
                continue
            found += [f"{relative}:{line}: {name}" for line, name in literal_names(path.read_text())
                      if name not in NOT_SETTINGS]
    return found


def test_no_variable_name_outside_the_declarations() -> None:
    assert literals_outside_declarations() == []


def test_the_literal_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "x.py").write_text('"""SWITCHYARD_IN_A_DOCSTRING is prose."""\n'
                                              'env = {"SWITCHYARD_POOL": "p"}  # SWITCHYARD_COMMENT\n'
                                              'message = f"{x} SWITCHYARD_DRIVER"\n')
    assert literals_outside_declarations(tmp_path) == ["stacks/x.py:2: SWITCHYARD_POOL",
                                                       "stacks/x.py:3: SWITCHYARD_DRIVER"]


def test_the_configuration_page_is_generated_from_the_declarations() -> None:
    page = (ROOT / config_docs.PAGE).read_text()
    assert page == config_docs.render(page), "docs/configuration.md differs: python -m scripts.config_docs"


def test_the_page_check_can_fail() -> None:
    page = (ROOT / config_docs.PAGE).read_text()
    stale = page.replace("`SWITCHYARD_RPC_POOL`", "`SWITCHYARD_POOL`", 1)
    assert stale != page and config_docs.render(stale) == page


def test_every_declared_name_follows_the_rule() -> None:
    config_docs.load_declarations()
    for item in declared():
        assert NAME.fullmatch(item.name), item.name
        if item.unit in ("s", "ms", "bytes"):
            assert item.name.endswith("_" + item.unit.upper()), f"{item.name} has no unit suffix"
        if item.module.startswith("switchyard.rpc"):
            assert item.name.startswith("SWITCHYARD_RPC_"), f"{item.name} has no part prefix"


def test_every_delay_field_is_declared() -> None:
    from switchyard.delay.settings import DELAY, DelaySettings

    assert set(DELAY) == {f.name for f in fields(DelaySettings)}


def test_a_renamed_variable_is_read_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from switchyard.rpc.settings import ControlSettings

    monkeypatch.setattr(reader, "_warned", set())
    renamed = "SWITCHYARD_UNBIND_DELAY is renamed SWITCHYARD_RPC_UNBIND_DELAY_S"
    with pytest.warns(FutureWarning, match=renamed):
        control = ControlSettings.from_env("core", {"SWITCHYARD_UNBIND_DELAY": "12"})
    assert control.delays.unbind_s == 12.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name: no warning
        control = ControlSettings.from_env("core", {"SWITCHYARD_RPC_UNBIND_DELAY_S": "13",
                                                    "SWITCHYARD_UNBIND_DELAY": "12"})
    assert control.delays.unbind_s == 13.0  # the new name wins
    assert setting("SWITCHYARD_UNBIND_DELAY").name == "SWITCHYARD_RPC_UNBIND_DELAY_S"


def _not_the_default(item: Setting[object]) -> str:
    if item.choices:
        return item.choices[-1]
    if isinstance(item.default, bool):
        return "1"
    return "17" if isinstance(item.default, int | float) else "x"


def test_each_renamed_variable_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    config_docs.load_declarations()
    monkeypatch.setattr(reader, "_warned", set())
    renamed = [item for item in declared() if item.old]
    assert len(renamed) > 30
    for item in renamed:
        value = _not_the_default(item)
        with pytest.warns(FutureWarning, match=f"{item.old[0]} is renamed {item.name}"):
            assert item.read({item.old[0]: value}) == item.read({item.name: value}) != item.default, item.name


def test_the_environment_wins_over_the_deployment_under_either_name() -> None:
    timeout = setting("SWITCHYARD_REDIS_TIMEOUT_S")
    deployed = {"SWITCHYARD_REDIS_TIMEOUT_S": "7"}
    assert timeout.read(ChainMap({}, deployed)) == 7.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert timeout.read(ChainMap({"SWITCHYARD_REDIS_TIMEOUT": "3"}, deployed)) == 3.0
    assert timeout.read(ChainMap({"SWITCHYARD_REDIS_TIMEOUT_S": ""}, deployed)) == 7.0  # empty is unset


def test_values_are_parsed_by_the_type_of_the_default() -> None:
    flag = Setting("SWITCHYARD_TEST_FLAG_ONLY", False, "a test's", documented=False)
    names = Setting("SWITCHYARD_TEST_LIST_ONLY", (), "a test's", documented=False)
    try:
        assert flag.read({"SWITCHYARD_TEST_FLAG_ONLY": "1"}) is True and flag.read({}) is False
        with pytest.raises(ConfigError, match="SWITCHYARD_TEST_FLAG_ONLY must be 1 or 0"):
            flag.read({"SWITCHYARD_TEST_FLAG_ONLY": "yes"})
        assert names.read({"SWITCHYARD_TEST_LIST_ONLY": "a, b,,c"}) == ("a", "b", "c")
        with pytest.raises(ValueError, match="declared twice"):
            Setting("SWITCHYARD_TEST_FLAG_ONLY", False, "again")
    finally:
        del reader.SETTINGS[flag.name], reader.SETTINGS[names.name]


def test_build_reads_each_field_from_its_setting() -> None:
    from switchyard.pending.settings import PENDING, PendingSettings

    built = build(PendingSettings, PENDING, {"SWITCHYARD_PENDING_POLL_WAIT_S": "5",
                                             "SWITCHYARD_PENDING_MAX_POLLS": "3"})
    assert built.poll_wait_s == 5.0 and built.max_polls_per_endpoint == 3 and built.prefix == "swpq"
    with pytest.raises(ConfigError, match="SWITCHYARD_PENDING_MAX_POLLS must be an integer"):
        build(PendingSettings, PENDING, {"SWITCHYARD_PENDING_MAX_POLLS": "many"})
