"""Small handlers for the demo, the benchmark and trying things out: ``switchyard.rpc.examples:echo``."""

from __future__ import annotations

import os
import time

from switchyard.rpc.worker.request import Request


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
    poison inventory; the other requests of the key are served meanwhile.
    """
    os._exit(70)


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
