"""stacks/ imports without a circle (read from the source, so a function-level import counts too).

A circle (bus -> nag -> the stack -> bus) was once worked around with late imports and a copy of
``nag.accept``; nag now reads the stack through protocols and imports no stack module.
"""

from __future__ import annotations

import ast
from pathlib import Path

STACKS = Path(__file__).resolve().parents[2] / "stacks"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "stacks":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stacks."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("stacks.")}
    return found


def test_stacks_modules_import_no_circle() -> None:
    graph = {path.stem: _imports(path) for path in STACKS.glob("*.py")}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for dep in sorted(graph.get(module, ())):
            assert dep not in path, f"import circle: {' -> '.join([*path[path.index(dep):], dep])}"
            if dep not in done:
                visit(dep, [*path, dep])
        done.add(module)

    for module in sorted(graph):
        visit(module, [module])
    assert "switchyard_stack" not in graph["nag"] and "localstack_stack" not in graph["nag"]
