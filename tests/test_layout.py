"""The layout of docs/layout.md, read from the code's own imports (``ast``, nothing is imported).

Floors, top-down: entry points, adapters, parts, core. An import points down a floor or sideways
inside one; the checker below reads every ``.py`` of ``switchyard/``, ``functions/``, ``stacks/``
and ``app.py``. Imports inside functions (the lazy ones) count for the floors: they are how a
module would reach upwards unseen. Every import counts for the circles too, those inside functions
and under ``if TYPE_CHECKING:`` included: a circle a lazy import hides is still two modules that
cannot be read, or moved, one without the other. A parent package's ``__init__`` also runs on an
import, but is not an edge here: only the module an import statement names is.

The last tests feed the same checker a small synthetic tree with one of each fault, so every
assertion is known to be able to fail.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("rpc", "delay", "pending", "bus", "spark")
PART_FILES = ("__init__.py", "settings.py", "errors.py", "ports.py", "store.py", "metrics.py", "service.py")
MAX_LINES = 500
# Modules allowed over MAX_LINES, each with the reason it may be (keep it empty).
LONG_MODULES: dict[str, str] = {}

CORE, PART, ADAPTER, ENTRY = "core", "part", "adapter", "entry point"
ENTRY_MODULES = ("app", "switchyard.__main__", "switchyard.cli", "switchyard.cli.main", "switchyard.demo")
# The package's faces for applications: they re-export from the parts, so they sit above them.
FACE_MODULES = ("switchyard.errors",)
ADAPTER_PACKAGES = ("switchyard.local", "switchyard.cli", "switchyard.aws", "functions", "stacks")


@dataclass(frozen=True)
class Import:
    target: str  # the module the statement names (``from a import b``: ``a.b`` if that is a module)
    line: int


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    imports: list[Import] = field(default_factory=list)


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def floor(name: str) -> str | None:
    """The floor of a first-party module, None for the standard library and third-party modules."""
    if name in ENTRY_MODULES or name in FACE_MODULES or _under(name, "switchyard.demo"):
        return ENTRY  # switchyard.cli: the face of cli.main
    if any(_under(name, p) for p in ADAPTER_PACKAGES):
        return ADAPTER
    if any(_under(name, f"switchyard.{p}") for p in PARTS):
        return PART
    if _under(name, "switchyard"):  # switchyard.core, and the package itself (its version)
        return CORE
    return None


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path) -> Iterator[Path]:
    for top in ("switchyard", "functions", "stacks"):
        if (root / top).is_dir():
            yield from sorted(p for p in (root / top).rglob("*.py") if "__pycache__" not in p.parts)
    if (root / "app.py").is_file():
        yield root / "app.py"


def _statements(body: Iterable[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at module level, in functions and under TYPE_CHECKING alike."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        else:
            for child_field in ("body", "orelse", "finalbody", "handlers", "cases"):
                children = getattr(node, child_field, None) or []
                yield from _statements([c for c in children if isinstance(c, ast.AST)])


def collect(root: Path) -> dict[str, Module]:
    """Every module of the tree at ``root`` with the first-party imports it makes."""
    files = {_module_name(root, p): p for p in source_files(root)}
    handlers = {name.split(".", 1)[1] for name in files if name.startswith("functions.")}
    modules = {}
    for name, path in files.items():
        text = path.read_text()
        module = modules[name] = Module(name, path, len(text.splitlines()))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _statements(ast.parse(text, str(path)).body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for target in dict.fromkeys(targets):
                if target.split(".", 1)[0] in handlers:  # Lambda imports a handler by its bare name
                    target = f"functions.{target}"
                if floor(target) is not None:
                    module.imports.append(Import(target, node.lineno))
    return modules


def floor_violations(modules: dict[str, Module]) -> list[str]:
    """Imports that point up a floor (a part into an adapter, an adapter into an entry point...)."""
    rank = {CORE: 0, PART: 1, ADAPTER: 2, ENTRY: 3}
    found = []
    for module in modules.values():
        mine = floor(module.name)
        for imp in module.imports:
            theirs = floor(imp.target)
            if mine and theirs and rank[theirs] > rank[mine]:
                found.append(f"{module.name} ({mine}) imports {imp.target} ({theirs}) at line {imp.line}")
    return sorted(found)


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """One circle per strongly connected group (Tarjan), as a path a -> ... -> a. Every import counts,
    those inside functions and under TYPE_CHECKING too: a circle hidden in a lazy import is still one."""
    graph = {name: sorted({i.target for i in m.imports if i.target in modules})
             for name, m in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph[node]:
                groups.append(group)

    for name in sorted(graph):
        if name not in index:
            connect(name)
    return sorted(_circle(graph, group) for group in groups)


def _circle(graph: dict[str, list[str]], group: set[str]) -> list[str]:
    """A shortest way from the group's first module back to itself (breadth first, inside the group)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in graph[node]:
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if nxt in group and nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start}")  # a strongly connected group always has one


def missing_part_files(root: Path) -> list[str]:
    return sorted(f"switchyard/{part}/{name}" for part in PARTS for name in PART_FILES
                  if not (root / "switchyard" / part / name).is_file())


def long_modules(modules: dict[str, Module], allowed: dict[str, str]) -> list[str]:
    return sorted(f"{m.path.relative_to(ROOT) if m.path.is_relative_to(ROOT) else m.path}: {m.lines} lines"
                  for m in modules.values() if m.lines > MAX_LINES and m.name not in allowed)


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return collect(ROOT)


def test_the_tree_is_read(modules: dict[str, Module]) -> None:
    """The checker sees the whole code base (a path typo would make every test below pass)."""
    floors = {floor(name) for name in modules}
    assert floors == {CORE, PART, ADAPTER, ENTRY}
    assert {"switchyard.core.errors", "switchyard.cli.main", "app", "functions.delay_enqueue"} <= set(modules)


def test_imports_point_down_the_floors(modules: dict[str, Module]) -> None:
    found = floor_violations(modules)
    assert not found, "imports up a floor (docs/layout.md):\n" + "\n".join(found)


def test_no_import_circles(modules: dict[str, Module]) -> None:
    found = [" -> ".join(c) for c in cycles(modules)]
    assert not found, "import circles:\n" + "\n".join(found)


def test_every_part_has_the_same_named_files() -> None:
    found = missing_part_files(ROOT)
    assert not found, "missing (docs/layout.md, one shape for every part):\n" + "\n".join(found)


def test_no_module_over_the_bound(modules: dict[str, Module]) -> None:
    assert set(LONG_MODULES) <= set(modules), "an allowed long module is gone: drop it from LONG_MODULES"
    found = long_modules(modules, LONG_MODULES)
    assert not found, f"over {MAX_LINES} lines:\n" + "\n".join(found)


# The checker itself, on a tree made to break each rule once.
SYNTHETIC = {
    "switchyard/__init__.py": "",
    "switchyard/core/__init__.py": "",
    "switchyard/core/settings.py": "import os\nimport switchyard.rpc.client\n",  # core -> part
    # the circle client -> worker -> client, and a lazy part -> adapter
    "switchyard/rpc/client.py": ("from switchyard.rpc import worker\n"
                                 "def lazy():\n    from switchyard.local import bridge\n"),
    "switchyard/rpc/worker.py": ("from typing import TYPE_CHECKING\nfrom . import client\n"
                                 "if TYPE_CHECKING:\n    from switchyard.rpc import store\n"),
    "switchyard/rpc/store.py": "import json\n",
    # a circle through a type-only import is a circle
    "switchyard/pending/ports.py": ("from typing import TYPE_CHECKING\n"
                                    "if TYPE_CHECKING:\n    from . import store\n"),
    "switchyard/pending/store.py": "from switchyard.pending.ports import Port\n",
    "switchyard/local/__init__.py": "",
    "switchyard/local/bridge.py": "import switchyard.demo\nimport delay_fire\n",  # adapter -> entry point
    "switchyard/demo/__init__.py": "from switchyard.local import bridge\n",
    "functions/delay_fire.py": "from switchyard.rpc import store\n",
    "stacks/big.py": "x = 1\n" * (MAX_LINES + 1),
    "app.py": "import stacks.big\n",
}


@pytest.fixture()
def synthetic(tmp_path: Path) -> Path:
    for relative, text in SYNTHETIC.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    (tmp_path / "switchyard/delay").mkdir()
    for name in PART_FILES[:-1]:  # every file of a part but service.py
        (tmp_path / "switchyard/delay" / name).write_text("")
    return tmp_path


def test_the_checker_reports_imports_up_a_floor(synthetic: Path) -> None:
    assert floor_violations(collect(synthetic)) == [
        "switchyard.core.settings (core) imports switchyard.rpc.client (part) at line 2",
        "switchyard.local.bridge (adapter) imports switchyard.demo (entry point) at line 1",
        "switchyard.rpc.client (part) imports switchyard.local.bridge (adapter) at line 3",
    ]


def test_the_checker_reports_a_circle_and_names_its_modules(synthetic: Path) -> None:
    modules = collect(synthetic)
    assert cycles(modules) == [
        ["switchyard.demo", "switchyard.local.bridge", "switchyard.demo"],
        ["switchyard.pending.ports", "switchyard.pending.store", "switchyard.pending.ports"],
        ["switchyard.rpc.client", "switchyard.rpc.worker", "switchyard.rpc.client"],
    ]
    assert "functions.delay_fire" in {i.target for i in modules["switchyard.local.bridge"].imports}


def test_the_checker_reports_missing_part_files_and_long_modules(synthetic: Path) -> None:
    assert "switchyard/delay/service.py" in missing_part_files(synthetic)
    assert "switchyard/delay/settings.py" not in missing_part_files(synthetic)
    modules = collect(synthetic)
    too_long = [line.rsplit("/", 1)[-1] for line in long_modules(modules, {})]
    assert too_long == [f"big.py: {MAX_LINES + 1} lines"]
    assert long_modules(modules, {"stacks.big": "allowed, with a reason"}) == []


CLIENT_LIBRARIES = {"redis", "pika", "psycopg", "psycopg_pool", "confluent_kafka", "boto3", "botocore",
                    "pyspark", "requests", "urllib3"}


def client_libraries_imported(path: Path) -> set[str]:
    """The client libraries a module imports (under TYPE_CHECKING too: a name in a signature counts)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & CLIENT_LIBRARIES


def test_no_port_names_a_client_librarys_type() -> None:
    """A part's ports are its contract with its adapters: they speak the part's own types and errors
    (the adapter translates, ``raise ... from``), so a service and its fakes never import a driver."""
    ports = sorted((ROOT / "switchyard").glob("*/ports.py"))
    assert len(ports) >= 5, ports
    leaking = {str(p.relative_to(ROOT)): sorted(client_libraries_imported(p)) for p in ports}
    assert {name: libs for name, libs in leaking.items() if libs} == {}


def test_the_port_check_sees_a_driver_import(tmp_path: Path) -> None:
    leaky = tmp_path / "ports.py"
    leaky.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import redis.exceptions\n")
    assert client_libraries_imported(leaky) == {"redis"}


ALIAS_DIRECTORIES = ("switchyard", "stacks", "functions", "bench", "scripts", "tests")


def one_letter_aliases(root: Path) -> list[str]:
    """Imports renamed to one lower-case letter (``protocol as p``): a reader then has to find the
    import to learn what ``p.KEY_HEADER`` is, and the letter clashes with locals. PySpark's own
    upper-case idiom (``functions as F``, ``types as T``) is not one of them."""
    found = []
    for top in ALIAS_DIRECTORIES:
        for path in sorted((root / top).rglob("*.py")) if (root / top).is_dir() else []:
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    found += [f"{path.relative_to(root)}:{node.lineno}: {alias.name} as {alias.asname}"
                              for alias in node.names
                              if alias.asname and len(alias.asname) == 1 and alias.asname.islower()]
    return found


def test_no_module_is_imported_under_a_one_letter_alias() -> None:
    assert one_letter_aliases(ROOT) == []


def test_the_alias_check_sees_one_letter_aliases(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "from switchyard.rpc import protocol as p\nimport json as j  # noqa\n"
        "from pyspark.sql import functions as F\nfrom stacks import constants\n"
        "def f():\n    from stacks import constants as c\n")
    assert one_letter_aliases(tmp_path) == ["tests/test_x.py:1: protocol as p",
                                            "tests/test_x.py:2: json as j",
                                            "tests/test_x.py:6: constants as c"]
