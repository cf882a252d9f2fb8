"""Where the documentation is, for messages that send a user to a page: the ``Documentation`` URL in
the installed distribution's metadata (``[project.urls]`` of pyproject.toml, the one place it is
written). Without one (a build that names none), the page's path in Switchyard's source."""

from __future__ import annotations

from functools import cache
from importlib import metadata

DISTRIBUTION = "switchyard"


@cache
def docs_base() -> str | None:
    """The ``Documentation`` project URL, without its trailing slash; None when the metadata has none."""
    try:
        urls = metadata.metadata(DISTRIBUTION).get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return None
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "documentation" and url.strip():
            return url.strip().rstrip("/")
    return None


def docs_link(page: str) -> str:
    """``page`` (``configuration.md``, ``rpc.md#redis-cluster``) as a link a pip user can open."""
    base = docs_base()
    return f"{base}/{page}" if base else f"docs/{page} in Switchyard's source"
