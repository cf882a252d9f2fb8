"""docs/api.md, the Python API reference, generated from the docstrings.

``python -m scripts.api_docs`` rewrites the page from the ``__all__`` of every module of ``MODULES``:
each class with its signature, docstring and public methods and properties, each function, each
enumeration's members. ``--check`` exits 1 when the page differs (``tests/test_api_docs.py`` checks
the same), so a changed signature or docstring changes the page in the same commit.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = Path("docs/api.md")
# The public modules, in the page's order: what an application imports.
MODULES = (
    "switchyard.rpc",
    "switchyard.pending",
    "switchyard.delay",
    "switchyard.bus",
    "switchyard.spark",
    "switchyard.errors",
)
HEADER = """# Python API reference

Generated from the docstrings by `python -m scripts.api_docs` (do not edit: `tests/test_api_docs.py`
fails when this page differs from the code). Every name below is in its module's `__all__`; the
guides say how the pieces fit: [rpc](rpc.md), [pending](pending.md), [delay](delay.md), [bus](bus.md),
[spark](spark.md), [errors](errors.md).
"""
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
_WIDTH = 100


def text(doc: str | None) -> str:
    """A docstring as Markdown: reST's double backticks as code spans, ``<`` outside them escaped (else
    ``<id>`` would read as an HTML tag)."""
    spans = (doc or "").replace("``", "`").strip().split("`")
    return "`".join(span.replace("<", "&lt;") if i % 2 == 0 else span for i, span in enumerate(spans))


def _annotation(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _parameters(sig: inspect.Signature) -> list[str]:
    shown, star = [], False
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            shown.append("*")
        star = star or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        item = prefix + p.name
        if p.annotation is not p.empty:
            item += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            item += (" = " if p.annotation is not p.empty else "=") + _ADDRESS.sub("", repr(p.default))
        shown.append(item)
    return shown


def signature(name: str, obj: Any) -> str:
    """``name(params)`` as a code block, one parameter a line when it is long."""
    try:
        sig = inspect.signature(obj, eval_str=False)
    except (TypeError, ValueError):
        return ""
    params = _parameters(sig)
    returns = "" if sig.return_annotation is inspect.Signature.empty or inspect.isclass(obj) else \
        f" -> {_annotation(sig.return_annotation)}"
    prefix = "async " if inspect.iscoroutinefunction(obj) else ""
    line = f"{prefix}{name}({', '.join(params)}){returns}"
    if len(line) > _WIDTH:
        line = f"{prefix}{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){returns}"
    return f"```python\n{line}\n```\n"


def members(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties ``cls`` defines itself (not those it inherits), in order."""
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property | staticmethod | classmethod) or inspect.isfunction(value):
            found.append((name, value))
    return found


def document_class(qualified: str, cls: type) -> list[str]:
    out = [f"### `{qualified}`\n"]
    if issubclass(cls, enum.Enum):
        out.append(", ".join(f"`{m.name}` = `{m.value!r}`" for m in cls) + "\n")
    elif not issubclass(cls, BaseException):
        out.append(signature(cls.__name__, cls))
    generated = f"{cls.__name__}("  # a dataclass without a docstring of its own gets its signature
    if cls.__doc__ and not cls.__doc__.startswith(generated) and (doc := text(inspect.getdoc(cls))):
        out.append(doc + "\n")
    after_doc = len(out)
    properties = []
    for name, value in members(cls):
        if isinstance(value, property):
            doc = text(inspect.getdoc(value))
            properties.append(f"- `{name}` (property)" + (f": {doc}" if doc else ""))
            continue
        func = value.__func__ if isinstance(value, staticmethod | classmethod) else value
        out.append(f"#### `{cls.__name__}.{name}`\n")
        out.append(signature(name, func))
        if doc := text(inspect.getdoc(func)):
            out.append(doc + "\n")
    if properties:
        out.insert(after_doc, "\n".join(properties) + "\n")
    return out


def document(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    out = [f"## `{module_name}`\n"]
    if doc := text(inspect.getdoc(module)):
        out.append(doc + "\n")
    constants = []
    for name in module.__all__:
        obj = getattr(module, name)
        qualified = f"{module_name}.{name}"
        if inspect.isclass(obj):
            out += document_class(qualified, obj)
        elif inspect.isfunction(obj):
            out += [f"### `{qualified}`\n", signature(name, obj)]
            if doc := text(inspect.getdoc(obj)):
                out.append(doc + "\n")
        else:
            constants.append(f"- `{name}` = `{_ADDRESS.sub('', repr(obj))}`")
    if constants:
        out += ["### Constants\n", "\n".join(constants) + "\n"]
    return out


def render() -> str:
    parts = [HEADER]
    for module in MODULES:
        parts += document(module)
    return "\n".join(part.rstrip("\n") + "\n" for part in parts if part)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md differs, write nothing")
    args = parser.parse_args(argv)
    path = ROOT / PAGE
    wanted = render()
    if args.check:
        if path.read_text() != wanted:
            print(f"{PAGE} differs from the docstrings: run python -m scripts.api_docs", file=sys.stderr)
            return 1
        return 0
    path.write_text(wanted)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
