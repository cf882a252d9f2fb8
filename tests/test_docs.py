"""The README is a front page and docs/ holds the rest: every link inside the repository resolves
(files and `#anchors`), the README stays short and links every docs page, and no page names a
design document by its number ("seed N") instead of the system or protocol it describes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
MAX_README_LINES = 250
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def pages() -> list[Path]:
    """The front page, docs/ and the examples' walk-throughs."""
    return [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*/README.md"))]


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link in code is not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path.read_text()):
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Links in ``path`` to files or anchors inside the repository that do not exist, and links that
    leave the repository by a relative path."""
    broken = []
    for line in prose(path.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.is_relative_to(root):
                broken.append(f"{target} (outside the repository)")
            elif not dest.exists():
                broken.append(f"{target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_inside_the_repository_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "rpc.md").write_text("# Keyed RPC\n\n## In Python\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Title\n\n[ok](rpc.md#in-python) [file](nope.md) [anchor](rpc.md#nope) "
                    "[here](#title) [out](../../shared/ARCHITECTURE.md) [web](https://example.com)\n"
                    "```\n[in code](nope-either.md)\n```\n")
    assert broken_links(page, root=tmp_path) == [
        "nope.md (no such file)", "rpc.md#nope (no such heading)",
        "../../shared/ARCHITECTURE.md (outside the repository)"]


def test_the_readme_is_a_front_page_that_links_every_docs_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < MAX_README_LINES
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for line in prose(text) for target in LINK.findall(line)}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert missing == [], f"docs pages the README does not link: {missing}"


def test_no_page_names_a_design_document_by_number() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}" for path in pages()
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bseeds? \d", line, re.IGNORECASE)]
    assert found == [], "name the system or protocol (keyed RPC, delay scheduler, ...), not the seed"
