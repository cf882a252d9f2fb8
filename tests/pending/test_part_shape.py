"""The pending part's shape (docs/layout.md): its metrics named once, Redis behind the store, the
environment read by settings only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from switchyard.pending import metrics

ROOT = Path(__file__).resolve().parents[2]
PART = ROOT / "switchyard" / "pending"
# The Redis adapter: the store, its admin operations and the two helpers only it uses.
REDIS_MODULES = {"store.py", "store_admin.py", "batch.py", "subscriber.py"}


def _upper_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def _runtime_imports(path: Path) -> set[str]:
    """Top-level packages a module imports when it runs (``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
               and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_every_metric_is_a_constant_named_after_it_and_in_emitted() -> None:
    constants = {name: value for name, value in vars(metrics).items()
                 if name.isupper() and isinstance(value, str)}
    assert constants, "no metric constants"
    for name, value in constants.items():
        assert name == _upper_snake(value), (name, value)
    assert set(constants.values()) == metrics.EMITTED


def test_no_emit_site_types_a_metric_name() -> None:
    """Emit sites use the constants; the part derives no names from outcome dataclasses
    (``emit_counts``), so EMITTED is every name it emits."""
    for path in sorted(PART.glob("*.py")):
        if path.name == "metrics.py":
            continue
        text = path.read_text()
        assert "emit_counts" not in text and "emit_gauge" not in text, path.name
        assert not re.search(r"""count\(\s*["']""", text), f"{path.name} types a metric name"


def test_the_alarms_watch_metrics_the_part_emits() -> None:
    """Every pending metric the CDK alarms name (a literal, or a constant of ``metrics``) is emitted."""
    source = (ROOT / "stacks" / "pending.py").read_text()
    named = set(re.findall(r"""_sum\(\s*["'](\w+)["']""", source))
    named |= {getattr(metrics, c) for c in re.findall(r"_sum\(\s*(?:\w+\.)?(PENDING_[A-Z_]+)", source)}
    assert named, "stacks/pending.py alarms on no pending metric"
    assert named <= metrics.EMITTED, named - metrics.EMITTED


def test_only_the_store_talks_to_redis() -> None:
    talking = {path.name for path in PART.glob("*.py") if "redis" in _runtime_imports(path)}
    assert talking <= REDIS_MODULES, talking - REDIS_MODULES


def test_no_service_module_knows_the_driver_or_its_errors() -> None:
    """The services (caller, processor, watcher, the API...) see ports only: no import of redis at
    all (type-checking ones included), no driver error caught (the adapter translates them into
    pending's errors), no state code compared as a bare string (``ports``' StrEnums)."""
    codes = {"q", "t", "a", "missing", "requeued", "not_taker", "withdrawn", "answered", "taken", "cancelled"}
    for path in sorted(PART.glob("*.py")):
        if path.name in REDIS_MODULES:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "redis" for a in node.names), path.name
            elif isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "redis", path.name
            elif isinstance(node, ast.Attribute):
                assert node.attr not in ("RedisError", "ResponseError", "refused"), (path.name, node.attr)
            elif isinstance(node, ast.Compare):
                compared = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                assert not codes & set(compared), (path.name, node.lineno, compared)


def test_only_settings_reads_the_environment() -> None:
    reading = {path.name for path in PART.glob("*.py")
               if re.search(r"\bos\.(environ|getenv)", path.read_text())}
    assert reading <= {"settings.py"}, reading


def test_the_remote_error_is_the_parts_and_the_cores_role() -> None:
    import switchyard.pending
    import switchyard.pending.errors
    from switchyard.core.errors import RemoteError

    assert switchyard.pending.RemoteError is switchyard.pending.errors.RemoteError
    assert issubclass(switchyard.pending.RemoteError, RemoteError)  # one catch for every part's
    assert issubclass(switchyard.pending.RemoteError, switchyard.pending.errors.PendingError)
