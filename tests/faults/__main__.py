"""``python -m tests.faults`` (``./dev faults``): every fault scenario, then the fuzz run; the account.

Exits non-zero if any request or message was lost, a scenario could not run, or the fuzz run failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tests.conftest import ROOT
from tests.faults.account import Account, table
from tests.faults.scenarios import SCENARIOS

FUZZ_EXAMPLES = 10_000  # at least this many generated events over the fuzz run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev faults", description=__doc__)
    parser.add_argument("--size", choices=("full", "short"), default="full",
                        help="full (default) or the short form CI runs")
    parser.add_argument("-k", "--only", default="", help="run only scenarios whose name contains this")
    parser.add_argument("--no-fuzz", action="store_true", help="skip the fuzz run")
    parser.add_argument("--fuzz-examples", type=int, default=FUZZ_EXAMPLES,
                        help=f"generated events over the whole fuzz run (default {FUZZ_EXAMPLES})")
    args = parser.parse_args(argv)
    os.environ.setdefault("SWITCHYARD_LOG_LEVEL", "WARNING")  # into the logs of the processes it starts
    workdir = Path(tempfile.mkdtemp(prefix="switchyard-faults-", dir=ROOT / ".local"))
    accounts: list[Account] = []
    failed: list[str] = []
    for scenario in SCENARIOS:
        if args.only not in scenario.name:
            continue
        print(f"faults: {scenario.name} ...", file=sys.stderr, flush=True)
        start = time.monotonic()
        try:
            account = scenario.run(args.size, workdir)
        except Exception as exc:
            traceback.print_exc()
            account = Account(scenario.name, 0, 0, 0, 0, time.monotonic() - start,
                              note=f"did not run: {type(exc).__name__}: {exc}"[:120])
        accounts.append(account)
        if not account.ok:
            failed.append(scenario.name)
        print(table([account]).splitlines()[2], file=sys.stderr, flush=True)
    fuzz_rc = 0
    if not args.no_fuzz:
        env = {**os.environ, "SWITCHYARD_FUZZ_EXAMPLES": str(args.fuzz_examples)}
        print(f"faults: fuzz run ({args.fuzz_examples} generated events) ...", file=sys.stderr, flush=True)
        # --timeout 0: 10,000 examples outlast the suite's per-test timeout on a busy machine.
        fuzz_rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   "--timeout", "0", str(ROOT / "tests/fuzz")], env=env, cwd=ROOT)
    print()
    print(table(accounts))
    print(f"\nlogs: {workdir}")
    if failed:
        print(f"FAILED: {', '.join(failed)} (lost or did not run)")
    if fuzz_rc:
        print(f"FAILED: the fuzz run (pytest exit {fuzz_rc})")
    return 1 if failed or fuzz_rc else 0


if __name__ == "__main__":
    sys.exit(main())
