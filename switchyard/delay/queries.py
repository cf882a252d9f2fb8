"""Named SQL loaded once from the package's ``sql/`` folder (queries.sql and numbered migrations)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

from psycopg import sql

_HEADER_RE = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)
_MIGRATION_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str


def _sql_dir() -> resources.abc.Traversable:
    return resources.files("switchyard.delay").joinpath("sql")


def parse_queries(text: str) -> dict[str, str]:
    """Split a queries file into ``{name: sql}``; comment lines are left out of the SQL."""
    parts = _HEADER_RE.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip()
    return queries


@functools.cache
def queries() -> dict[str, str]:
    """All named queries (loaded once per process)."""
    return parse_queries(_sql_dir().joinpath("queries.sql").read_text(encoding="utf-8"))


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """The numbered migrations, in order (loaded once per process)."""
    found = []
    for entry in _sql_dir().joinpath("migrations").iterdir():
        m = _MIGRATION_RE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    return tuple(sorted(found, key=lambda mig: mig.version))


def bind_schema(text: str, schema: str) -> sql.Composed:
    """Substitute ``{schema}`` with a quoted identifier (the name was validated, and is quoted anyway)."""
    return sql.SQL(text).format(schema=sql.Identifier(schema))


@functools.cache
def schema_queries(schema: str) -> dict[str, sql.Composed]:
    """The named queries bound to one schema, composed once per schema."""
    return {name: bind_schema(text, schema) for name, text in queries().items()}
