"""Small handlers for the demo, the benchmark and trying things out: ``switchyard.rpc.examples:echo``."""

from __future__ import annotations

import os
import time

from switchyard.rpc.worker.request import Request

# The exit code of ``crash``: the driver logs a worker exiting with it at info, as intended (a demo's
# or a scenario's poison), not as a warning a person should act on. EX_SOFTWARE (70) stays a warning.
INTENDED_CRASH_EXIT = 86


def echo(request: Request) -> bytes:
    """Answer with the request body."""
    return request.body


def describe(request: Request) -> str:
    """Answer with who served the request, for demos: ``key=... worker=... body=...``."""
    return f"key={request.key} worker={request.worker_id} body={request.text()}"


def sleepy(request: Request) -> bytes:
    """Sleep ``SLEEPY_SECONDS`` (default 0.5 s) before echoing: a slow worker."""
    time.sleep(float(os.environ.get("SLEEPY_SECONDS", "0.5")))
    return request.body


def divide(request: Request) -> str:
    """``a/b`` -> the quotient; a bad input raises, which becomes a negative response."""
    a, b = request.text().split("/")
    return str(float(a) / float(b))


def crash(request: Request) -> bytes:
    """A poison request: the worker process dies on it (as a segfault would), every time.

    The broker redelivers it to the next worker until the delivery limit dead-letters it to the
    poison inventory; the other requests of the key are served meanwhile. It exits with
    ``INTENDED_CRASH_EXIT``, so the driver logs the exit as intended rather than warning.
    """
    os._exit(INTENDED_CRASH_EXIT)


def demo(request: Request) -> bytes | str:
    """The demo's workers: ``math`` divides, ``slow`` sleeps ``SLEEPY_SECONDS``, ``poison`` crashes
    the worker (see ``crash``), others describe."""
    if request.key == "poison":
        return crash(request)
    if request.key == "math":
        return divide(request)
    if request.key == "slow":
        return sleepy(request)
    return describe(request)
