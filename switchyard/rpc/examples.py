"""Kept importable: the demo handlers live in ``switchyard.rpc.worker.examples`` (the Dockerfile runs
``switchyard.rpc.examples:describe``, the docs ``switchyard.rpc.examples:echo``)."""

from switchyard.rpc.worker.examples import crash, demo, describe, divide, echo, sleepy

__all__ = ["crash", "demo", "describe", "divide", "echo", "sleepy"]
