"""Import every Lambda handler from the built layer in a clean interpreter, as Lambda would, and time it.

Each handler is imported in a fresh ``python -I -S`` process (no site-packages, no user site, no
PYTHON* variables) whose path holds only the standard library, the layer's ``python/`` directory
and ``functions/``: a module missing from the layer fails here, not in Lambda. The time is that of
``import <handler>`` (the cold-start share the code controls), best of ``--runs`` processes.
Also checks the layer and the functions against Lambda's 250 MB unzipped limit.

    layers/build.sh && .venv/bin/python bench/layer_imports.py [--runs 3] [--aim-ms 300]

Exits non-zero if a handler fails to import or the size limit is passed (not for slow imports:
those are printed against the aim, since a loaded machine measures slower than Lambda).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
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
PROBE = """
import sys, time
sys.path[:0] = [{layer!r}, {functions!r}]
start, cpu = time.perf_counter(), time.process_time()
import {module}
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
assert callable(getattr({module}, {entry!r})), "no entry point {entry}"
bad = [m.__file__ for m in list(sys.modules.values())
       if getattr(m, "__file__", None) and "site-packages" in m.__file__]
assert not bad, f"imported from outside the layer: {{bad[:3]}}"
print(elapsed, cpu)
"""


@dataclass
class ImportResult:
    handler: str
    best_ms: float  # wall clock, what a cold start waits
    runs_ms: list[float]
    error: str = ""
    cpu_ms: float = float("nan")  # CPU time of the best run: what a loaded machine distorts least


def base_python() -> str:
    """The interpreter of the Lambda runtime's Python that layers/build.sh compiled the layer with (it
    records the path in the layer's ``.python``): not the venv's, which is the project's 3.11 and would
    add the venv's site-packages."""
    recorded = LAYER / ".python"
    if not recorded.is_file():
        raise SystemExit(f"{recorded} is missing: run layers/build.sh first")
    return recorded.read_text().strip()


def handlers() -> dict[str, str]:
    """Handler module -> entry point, for every file of functions/."""
    found = {}
    for path in sorted(FUNCTIONS.glob("*.py")):
        text = path.read_text()
        found[path.stem] = "on_event" if "def on_event" in text else "lambda_handler"
    return found


def time_import(module: str, entry: str, runs: int) -> ImportResult:
    code = PROBE.format(layer=str(LAYER / "python"), functions=str(FUNCTIONS), module=module, entry=entry)
    times: list[float] = []
    cpus: list[float] = []
    for _ in range(runs):
        done = subprocess.run(
            [base_python(), "-I", "-S", "-c", code],
            env=LAMBDA_ENV,
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
        )
        if done.returncode != 0:
            return ImportResult(module, float("nan"), times, done.stderr.strip().splitlines()[-1])
        wall, cpu = (float(x) * 1000 for x in done.stdout.strip().splitlines()[-1].split())
        times.append(wall)
        cpus.append(cpu)
    best = times.index(min(times))
    return ImportResult(module, times[best], times, cpu_ms=cpus[best])


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
    args = parser.parse_args()
    if not (LAYER / "python" / "switchyard").is_dir():
        print(f"layer not built at {LAYER}: run layers/build.sh first", file=sys.stderr)
        return 2
    layer_mb, functions_mb = size_mb(LAYER), size_mb(FUNCTIONS)
    total = layer_mb + functions_mb
    print(
        f"layer {layer_mb:.1f} MB + functions {functions_mb:.2f} MB = {total:.1f} MB unzipped "
        f"(Lambda's limit: {LAMBDA_UNZIPPED_LIMIT_MB} MB)"
    )
    results = [time_import(module, entry, args.runs) for module, entry in handlers().items()]
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} cores (wall times stretch with load; CPU less)")
    print(f"{'handler':<22} {'best ms':>8} {'cpu ms':>7}  runs (ms)        aim {args.aim_ms:.0f} ms")
    for r in results:
        if r.error:
            print(f"{r.handler:<22} {'FAILED':>8}  {r.error}")
            continue
        mark = "ok" if r.best_ms <= args.aim_ms else "ABOVE AIM"
        runs = ", ".join(f"{t:.0f}" for t in r.runs_ms)
        print(f"{r.handler:<22} {r.best_ms:8.0f} {r.cpu_ms:7.0f}  {runs:<16} {mark}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "layer_mb": layer_mb,
                "functions_mb": functions_mb,
                "aim_ms": args.aim_ms,
                "cpus": os.cpu_count(),
                "results": [asdict(r) for r in results],
            },
            indent=2,
        )
    )
    failed = [r.handler for r in results if r.error]
    if failed or total > LAMBDA_UNZIPPED_LIMIT_MB:
        print(f"FAILED: imports {failed}, size {total:.1f} MB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
