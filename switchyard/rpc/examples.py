"""Small handlers for the demo, the benchmark and trying things out: ``switchyard.rpc.examples:echo``."""

from __future__ import annotations

import os
import time

from switchyard.rpc.worker import Request


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


def demo(request: Request) -> bytes | str:
    """The demo's workers: ``math`` divides, ``slow`` sleeps ``SLEEPY_SECONDS``, others describe."""
    if request.key == "math":
        return divide(request)
    if request.key == "slow":
        return sleepy(request)
    return describe(request)
