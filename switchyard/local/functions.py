"""The Lambda handlers by name, so the local runtime runs that very code: ``switchyard.aws.handlers``
(``functions/<name>.py``, Lambda's entry points, re-export them), installed with the package."""

from __future__ import annotations

import importlib
import pkgutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from switchyard.aws import handlers

HANDLERS = frozenset(m.name for m in pkgutil.iter_modules(handlers.__path__))
# Sample events in the exact AWS shapes, shipped with the package (``events/`` in a checkout)
SAMPLE_EVENTS_DIR = Path(handlers.__path__[0]).parent / "events"
SCHEDULE_SAMPLE = "eventbridge_schedule.json"
SAMPLE_EVENT = {"rpc_orphans": "rmq_orphan.json", "rpc_dead_letters": "rmq_dead_letter.json",
                "rpc_activity": "rmq_activity.json", "rpc_reconcile": SCHEDULE_SAMPLE,
                "delay_enqueue": "msk_delay_input.json", "delay_fire": SCHEDULE_SAMPLE,
                "delay_sweep": SCHEDULE_SAMPLE, "bus_housekeeping": SCHEDULE_SAMPLE}


def load_function(name: str) -> ModuleType:
    """The handler module of ``functions/<name>.py`` (imported once per process)."""
    if name not in HANDLERS:
        raise ImportError(f"no Lambda handler {name!r}; available: {', '.join(sorted(HANDLERS))}")
    return importlib.import_module(f"{handlers.__name__}.{name}")


def scheduled_event(rule: str) -> dict[str, Any]:
    """An EventBridge scheduled event, as a schedule rule delivers it."""
    return {
        "version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event", "source": "aws.events",
        "account": "000000000000", "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "local", "resources": [f"arn:aws:events:local:000000000000:rule/{rule}"], "detail": {},
    }
