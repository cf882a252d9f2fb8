"""The worker runtime (the keyed RPC design's worker protocol around a handler) and its demo handlers.

A worker author imports from here: ``Request``, ``Requeue``, and ``Worker`` / ``run_worker`` to run one.
``request`` holds what a handler sees, ``runtime`` the consume-reply-ack loop, ``examples`` the demo
handlers (``switchyard.rpc.examples:describe``).
"""

from switchyard.rpc.worker.request import Handler, Request, Requeue, WorkerConfig, WorkerStats, load_handler
from switchyard.rpc.worker.runtime import Worker, run_worker

__all__ = ["Handler", "Request", "Requeue", "Worker", "WorkerConfig", "WorkerStats", "load_handler",
           "run_worker"]
