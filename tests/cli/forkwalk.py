"""Run many ``python -m switchyard`` commands from one interpreter that imported switchyard once.

Why: the CLI walk (tests/cli/test_errors.py) runs ~220 commands, and each subprocess spent most of
its half second importing switchyard; on CI's two cores that was over a minute. Here one process
imports the command modules (``build_parser()``), then forks a child per command. A child is still
its own process, run as ``python -m switchyard`` runs: ``switchyard/__main__.py`` through ``runpy``,
its exit status, stdout and stderr its own, an uncaught exception printed by the interpreter (a
traceback) and interpreter shutdown (atexit, non-daemon threads joined) as usual; a child that
outlives the timeout is killed.

Usage: ``python -m tests.cli.forkwalk CASES.json OUT_DIR PARALLEL TIMEOUT_S``. CASES is a list of
argv lists; ``OUT_DIR/results.json`` gets, in the same order, ``{"rc", "stdout", "stderr",
"timed_out"}``. Run it with the environment and working directory the commands should have.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path

POLL_S = 0.005
# Libraries commands import when they run (AWS for --stack, Redis for the bus and pending parts):
# imported here once too. A command's own ``import`` statements still run in its child.
PRELOAD = ("boto3", "redis")


def _child(argv: list[str], out: Path, err: Path) -> None:
    """In the forked child: stdout and stderr to files, then ``python -m switchyard ARGV``.

    ``switchyard/__main__.py`` ends in ``SystemExit`` (or an uncaught exception), which unwinds to
    the interpreter as in ``python -m``; nothing between here and the top catches it (no ``with``
    or ``finally`` in the frames above: the child would run the parent's cleanup).
    """
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["-m", *argv]  # as ``python -m``; run_module puts the module's path in argv[0]
    runpy.run_module("switchyard", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def walk(cases: list[list[str]], parallel: int, timeout_s: float, scratch: Path) -> list[dict[str, object]]:
    """Each case's exit status and output, at most ``parallel`` children at a time."""
    from switchyard.cli import build_parser

    build_parser()  # imports every command module: the cost the children share
    for name in PRELOAD:
        importlib.import_module(name)
    # Out of the collector's reach: a child writing to every object's header at exit would copy
    # the parent's pages (most of a child's CPU otherwise). The child's own objects are collected.
    gc.freeze()
    # A thread would not survive fork: the children must start as a fresh interpreter would.
    assert threading.active_count() == 1, threading.enumerate()
    codes: dict[int, int] = {}
    timed_out: set[int] = set()
    running: dict[int, tuple[int, float]] = {}  # pid -> (case index, started)
    queue = list(range(len(cases)))
    while queue or running:
        while queue and len(running) < parallel:
            index = queue.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(cases[index], scratch / f"{index}.out", scratch / f"{index}.err")
            running[pid] = (index, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            codes[running.pop(pid)[0]] = os.waitstatus_to_exitcode(status)
            continue
        now = time.monotonic()
        for pid, (index, started) in running.items():
            if now - started > timeout_s and index not in timed_out:
                timed_out.add(index)
                os.kill(pid, signal.SIGKILL)
        time.sleep(POLL_S)  # pace: the walker's turn (reap the exited, kill the overdue)
    return [{"rc": codes[i], "stdout": (scratch / f"{i}.out").read_text(errors="replace"),
             "stderr": (scratch / f"{i}.err").read_text(errors="replace"), "timed_out": i in timed_out}
            for i in range(len(cases))]


def main() -> None:
    cases_path, out_dir, parallel, timeout_s = sys.argv[1:]
    cases = json.loads(Path(cases_path).read_text())
    results = walk(cases, int(parallel), float(timeout_s), Path(out_dir))
    (Path(out_dir) / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
