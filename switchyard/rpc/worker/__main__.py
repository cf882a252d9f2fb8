"""``python -m switchyard.rpc.worker --handler module:function``: the worker group drivers' command.

The ``switchyard`` command line registers every area's subcommands first (a second on a loaded
machine, most of a new key's first call); a worker needs only its runtime. Configured by the worker
protocol's variables (``WORKER_*``), which the drivers set; ``WORKER_SPARE=1`` starts it as a warm
spare (``spare``). ``switchyard worker`` is the same with flags, for people.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from switchyard.core.errors import SwitchyardError
from switchyard.rpc.spares import SPARE_ENV


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m switchyard.rpc.worker",
                                     description="Serve one key's requests (the drivers' worker command).")
    parser.add_argument("--handler", required=True, help="the handler to run, as module:function")
    args = parser.parse_args(argv)
    try:
        if os.environ.get(SPARE_ENV) == "1":
            from switchyard.rpc.worker.spare import run_spare

            stats = run_spare(args.handler)
        else:
            from switchyard.rpc.worker.runtime import run_worker

            stats = run_worker(args.handler)
    except SwitchyardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"worker stopped: {stats.handled} handled, {stats.errors} errors, {stats.requeued} requeued",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
