"""Import every Lambda handler from the built layer in a clean interpreter, as Lambda would, and time it.

Each handler is imported in a fresh ``python -I -S`` process (no site-packages, no user site, no
PYTHON* variables) whose path holds only the standard library, the layer's ``python/`` directory
and ``functions/``: a module missing from the layer fails here, not in Lambda. The time is that of
``import <handler>`` (the cold-start share the code controls), best of ``--runs`` processes.
Also checks the layer and the functions against Lambda's 250 MB unzipped limit, and that no handler
loads a module of the local runtime or the command line (``ADAPTER_PREFIXES``): a handler that
does carries the local Kafka bridge, say, into every cold start.

    layers/build.sh && .venv/bin/python bench/layer_imports.py [--runs 3] [--aim-ms 300]

``--source TREE`` imports from a source tree instead (``TREE`` and ``TREE/functions`` first on the
path of a fresh ``python -I`` of this interpreter, third-party modules from its site-packages), no
layer needed: the same probe, e.g. on ``git archive`` exports of two commits to compare them.

    .venv/bin/python bench/layer_imports.py --source /tmp/before --only delay_ --json /tmp/before.json

Exits non-zero if a handler fails to import, loads an adapter module, or the size limit is passed
(not for slow imports: those are printed against the aim, since a loaded machine measures slower
than Lambda).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYER = ROOT / "layers/build/switchyard"
FUNCTIONS = ROOT / "functions"
LAMBDA_UNZIPPED_LIMIT_MB = 250

# What the Lambda runtime sets for a function of the stack (minus credentials and endpoints).
LAMBDA_ENV = {
    "AWS_LAMBDA_FUNCTION_NAME": "switchyard-import-check",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "POWERTOOLS_SERVICE_NAME": "switchyard-import-check",
    "POWERTOOLS_METRICS_NAMESPACE": "Switchyard",
    "POWERTOOLS_LOG_LEVEL": "INFO",
    "LANG": "C.UTF-8",
}
# Modules a Lambda handler must never load: the local runtime, the command line, the demo.
ADAPTER_PREFIXES = ("switchyard.local", "switchyard.cli", "switchyard.demo")
PROBE = """
import json, sys, time
sys.path[:0] = {paths!r}
start, cpu = time.perf_counter(), time.process_time()
import {module}
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
assert callable(getattr({module}, {entry!r})), "no entry point {entry}"
import switchyard
assert switchyard.__file__.startswith({paths[0]!r}), f"switchyard from {{switchyard.__file__}}"
bad = [m.__file__ for m in list(sys.modules.values())
       if {layer_only!r} and getattr(m, "__file__", None) and "site-packages" in m.__file__]
assert not bad, f"imported from outside the layer: {{bad[:3]}}"
adapters = sorted(m for m in sys.modules if m.startswith({adapters!r}))
print(json.dumps([elapsed, cpu, adapters]))
"""


@dataclass
class ImportResult:
    handler: str
    best_ms: float  # wall clock, what a cold start waits
    runs_ms: list[float]
    error: str = ""
    cpu_ms: float = float("nan")  # CPU time of the best run: what a loaded machine distorts least
    adapters: list[str] = field(default_factory=list)  # adapter modules it loaded: must be none


def base_python() -> str:
    """The interpreter of the Lambda runtime's Python that layers/build.sh compiled the layer with (it
    records the path in the layer's ``.python``): not the venv's, which is the project's 3.11 and would
    add the venv's site-packages."""
    recorded = LAYER / ".python"
    if not recorded.is_file():
        raise SystemExit(f"{recorded} is missing: run layers/build.sh first")
    return recorded.read_text().strip()


def handlers(functions: Path = FUNCTIONS) -> dict[str, str]:
    """Handler module -> entry point, for every file of ``functions``."""
    found = {}
    for path in sorted(functions.glob("*.py")):
        text = path.read_text()
        found[path.stem] = "on_event" if "import on_event" in text else "lambda_handler"
    return found


def adapter_modules_loaded(names: list[str]) -> list[str]:
    """The modules of ``names`` under ``ADAPTER_PREFIXES`` (a dotted prefix, not a string prefix)."""
    return [n for n in names if any(n == p or n.startswith(p + ".") for p in ADAPTER_PREFIXES)]


def probe(module: str, entry: str, source: Path | None = None) -> tuple[float, float, list[str]]:
    """Import ``module`` once in a fresh interpreter: wall and CPU seconds, and the adapter modules it
    loaded. From the built layer (the Lambda runtime's Python, ``-I -S``) or from a source tree."""
    if source is None:
        command, paths = [base_python(), "-I", "-S"], [str(LAYER / "python"), str(FUNCTIONS)]
    else:
        command, paths = [sys.executable, "-I"], [str(source), str(source / "functions")]
    code = PROBE.format(paths=paths, module=module, entry=entry, layer_only=source is None,
                        adapters=ADAPTER_PREFIXES)
    done = subprocess.run([*command, "-c", code], env=LAMBDA_ENV, capture_output=True, text=True,
                          timeout=120, cwd="/")
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1])
    wall, cpu, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return wall, cpu, adapter_modules_loaded(loaded)


def time_import(module: str, entry: str, runs: int, source: Path | None = None) -> ImportResult:
    """Best of ``runs`` imports, after one to write the bytecode (not counted). A handler that loads
    adapter modules is timed too (to compare with a tree where it does not), and marked failed."""
    times: list[float] = []
    cpus: list[float] = []
    try:
        _, _, adapters = probe(module, entry, source)
        for _ in range(runs):
            wall, cpu, _ = probe(module, entry, source)
            times.append(wall * 1000)
            cpus.append(cpu * 1000)
    except RuntimeError as exc:
        return ImportResult(module, float("nan"), times, str(exc))
    best = times.index(min(times))
    error = f"loads adapter modules: {', '.join(adapters)}" if adapters else ""
    return ImportResult(module, times[best], times, error, cpus[best], adapters)


def size_mb(path: Path) -> float:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    return total / 1_000_000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--aim-ms", type=float, default=300.0)
    parser.add_argument("--json", type=Path, default=ROOT / "bench/results/layer_imports.json")
    parser.add_argument("--source", type=Path, help="import from this source tree, not the built layer")
    parser.add_argument("--only", default="", metavar="PREFIX", help="only the handlers named PREFIX...")
    args = parser.parse_args()
    source = args.source.resolve() if args.source else None
    summary: dict[str, object] = {"source": str(source) if source else None}
    total = 0.0
    if source is None:
        if not (LAYER / "python" / "switchyard").is_dir():
            print(f"layer not built at {LAYER}: run layers/build.sh first", file=sys.stderr)
            return 2
        layer_mb, functions_mb = size_mb(LAYER), size_mb(FUNCTIONS)
        total = layer_mb + functions_mb
        summary.update(layer_mb=layer_mb, functions_mb=functions_mb)
        print(
            f"layer {layer_mb:.1f} MB + functions {functions_mb:.2f} MB = {total:.1f} MB unzipped "
            f"(Lambda's limit: {LAMBDA_UNZIPPED_LIMIT_MB} MB)"
        )
    else:
        print(f"from the source tree {source}, third-party modules from {sys.prefix}")
    found = handlers(source / "functions" if source else FUNCTIONS)
    results = [time_import(module, entry, args.runs, source)
               for module, entry in found.items() if module.startswith(args.only)]
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} cores (wall times stretch with load; CPU less)")
    print(f"{'handler':<22} {'best ms':>8} {'cpu ms':>7}  runs (ms)        aim {args.aim_ms:.0f} ms")
    for r in results:
        if not r.runs_ms:
            print(f"{r.handler:<22} {'FAILED':>8}  {r.error}")
            continue
        mark = f"FAILED: {r.error}" if r.error else "ok" if r.best_ms <= args.aim_ms else "ABOVE AIM"
        runs = ", ".join(f"{t:.0f}" for t in r.runs_ms)
        print(f"{r.handler:<22} {r.best_ms:8.0f} {r.cpu_ms:7.0f}  {runs:<16} {mark}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    summary.update(aim_ms=args.aim_ms, cpus=os.cpu_count(), load=load, results=[asdict(r) for r in results])
    args.json.write_text(json.dumps(summary, indent=2))
    failed = [r.handler for r in results if r.error]
    if failed or total > LAMBDA_UNZIPPED_LIMIT_MB:
        print(f"FAILED: imports {failed}, size {total:.1f} MB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
