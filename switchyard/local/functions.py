"""Load the Lambda handlers of ``functions/`` by path, so the local runtime runs that very code.

``functions/`` is not part of the installed package (Lambda deploys it as its own asset), so it
is imported from the source tree, once per process.
"""

from __future__ import annotations

import importlib.util
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

FUNCTIONS_DIR = Path(__file__).resolve().parents[2] / "functions"
_loaded: dict[str, ModuleType] = {}
_lock = threading.Lock()


def load_function(name: str) -> ModuleType:
    """Import ``functions/<name>.py`` (cached)."""
    with _lock:
        if name in _loaded:
            return _loaded[name]
        path = FUNCTIONS_DIR / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"switchyard_functions.{name}", path)
        if spec is None or spec.loader is None or not path.exists():
            raise ImportError(f"cannot load {path}: run Switchyard from its source tree")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[name] = module
        return module


def scheduled_event(rule: str) -> dict[str, Any]:
    """An EventBridge scheduled event, as a schedule rule delivers it."""
    return {
        "version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event", "source": "aws.events",
        "account": "000000000000", "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "local", "resources": [f"arn:aws:events:local:000000000000:rule/{rule}"], "detail": {},
    }
