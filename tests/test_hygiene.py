"""The tests wait for events, not for time: every ``time.sleep`` in tests/ is either the poll interval
of the one wait helper (``tests.conftest.wait_for``) or says on its line why it is time on purpose.

A sleep that stands for "it has happened by now" is a race (the red CI runs were such races) and slow
when it is not. Two markers name the sleeps that are not waits:

* ``# window: ...`` holds a window open to show that something does NOT happen in it;
* ``# pace: ...`` is time spent on purpose by a test's own actor (a slow handler, a paced sender, a
  dripping server), not a wait for anything.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MARKERS = ("# window:", "# pace:")
WAIT_HELPER = ("conftest.py", "wait_for")  # the one place a bare sleep is a poll interval


def _sleep_calls(tree: ast.AST) -> list[ast.Call]:
    """Calls of ``time.sleep`` (or of ``sleep`` imported from ``time``)."""
    bare = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module == "time" for alias in node.names if alias.name == "sleep"}
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "sleep" and isinstance(func.value, ast.Name)
                and func.value.id == "time") or (isinstance(func, ast.Name) and func.id in bare):
            calls.append(node)
    return calls


def _helper_lines(tree: ast.AST) -> set[int]:
    name = WAIT_HELPER[1]
    helpers = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == name]
    return {line for node in helpers for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)}


def unmarked_sleeps(root: Path) -> list[str]:
    """``path:line`` of every sleep under ``root`` that is neither the wait helper's nor marked."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        if "sleep" not in source:
            continue
        tree = ast.parse(source)
        lines = source.splitlines()
        allowed = _helper_lines(tree) if path.relative_to(root).as_posix() == WAIT_HELPER[0] else set()
        for call in _sleep_calls(tree):
            span = lines[call.lineno - 1:(call.end_lineno or call.lineno)]
            if call.lineno not in allowed and not any(marker in line for line in span for marker in MARKERS):
                found.append(f"{path.relative_to(root).as_posix()}:{call.lineno}")
    return found


def test_every_sleep_in_the_tests_is_a_poll_interval_or_marked() -> None:
    found = unmarked_sleeps(TESTS)
    assert found == [], ("a bare time.sleep: wait for the event with tests.conftest.wait_for, or say on the "
                         f"line why the time passes ({' or '.join(MARKERS)}): {found}")


def test_the_checker_finds_a_bare_sleep_and_accepts_the_marked_ones(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "import time\n\ndef wait_for(p):\n    while not p():\n        time.sleep(0.1)\n")
    (tmp_path / "test_x.py").write_text(
        "import time\nfrom time import sleep as nap\n\n"
        "def test_a():\n    time.sleep(1)\n"
        "    time.sleep(\n        0.5,  # window: nothing arrives\n    )\n"
        "    time.sleep(0.2)  # pace: a slow handler\n"
        "    nap(3)\n")
    assert unmarked_sleeps(tmp_path) == ["test_x.py:5", "test_x.py:10"]


# -- merge leftovers ----------------------------------------------------------------------------
CONFLICT_MARKER = re.compile(r"^(<{7}|>{7}) ", re.M)  # a merge's "<<<<<<< HEAD" / ">>>>>>> branch"


def conflict_markers(root: Path, files: list[str]) -> list[str]:
    """``file:line`` of every merge conflict marker left in ``files`` (paths under ``root``)."""
    found = []
    for name in files:
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary, or a symlink to a directory
        found += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}" for m in CONFLICT_MARKER.finditer(text)]
    return found


def test_no_merge_conflict_marker_is_left_in_a_tracked_file() -> None:
    """A conflict resolved in haste once left both sides and their markers in docs/operations.md."""
    root = TESTS.parent
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True)
    assert conflict_markers(root, tracked.stdout.splitlines()) == []


def test_the_marker_check_finds_a_left_conflict(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("text\n<<<<<<< HEAD\nmine\n=======\ntheirs\n>>>>>>> other\n")
    (tmp_path / "b.md").write_text("a line with <<<<<<< inside is fine\n")
    assert conflict_markers(tmp_path, ["a.md", "b.md"]) == ["a.md:2", "a.md:6"]
