"""Handlers the RPC tests run in real worker subprocesses, beside the package's own
(``switchyard.rpc.examples``: ``sleepy`` is the tests' slow echo)."""

from __future__ import annotations

import json
import os
import time

from switchyard.rpc.worker import Request, Requeue


def whoami(request: Request) -> str:
    return f"{request.worker_id}|{request.key}|{request.text()}"


def fail(request: Request) -> bytes:
    raise ValueError(f"cannot handle {request.text()}")


def requeue_unless_named(request: Request) -> str:
    """Requeues everything unless this worker's id is ANSWERER: proves another worker answers."""
    if request.worker_id != os.environ["ANSWERER"]:
        raise Requeue()
    return f"{request.worker_id}|{request.delivery_count}"


def crash(request: Request) -> bytes:
    """Kills the worker process mid-request, as a poison message would."""
    if request.body == b"crash":
        os._exit(17)
    return request.body


def control_plane_echo(request: Request) -> bytes:
    """Echoes the body; ``crash`` kills the worker (poison), ``slow:<s>`` sleeps first."""
    if request.body == b"crash":
        os._exit(17)
    if request.body.startswith(b"slow:"):
        time.sleep(float(request.body[5:]))  # pace: a slow handler
    return request.body


def shed_until(request: Request) -> str:
    """Sheds (``Requeue``) until the request was delivered SHED_TIMES times, then answers the count."""
    if request.delivery_count < int(os.environ.get("SHED_TIMES", "6")):
        raise Requeue()
    return str(request.delivery_count)


def slow_logged(request: Request) -> bytes:
    """Appends a line to START_LOG when it starts, sleeps SLOW_SECONDS, then echoes the body."""
    with open(os.environ["START_LOG"], "a") as log:
        log.write(f"{request.worker_id} {request.text()}\n")
    time.sleep(float(os.environ.get("SLOW_SECONDS", "1.0")))  # pace: a slow handler
    return request.body


def traced(request: Request) -> str:
    """Sheds until delivered SHED_TIMES times (default 0), then answers the request's traceparent
    and the logger's correlation id while it runs, as JSON."""
    import json

    from switchyard.core.observability import logger

    if request.delivery_count < int(os.environ.get("SHED_TIMES", "0")):
        raise Requeue()
    return json.dumps({"traceparent": request.headers.get("traceparent"),
                       "correlation_id": logger.thread_safe_get_current_keys().get("correlation_id")})


def logged(request: Request) -> bytes:
    """Appends ``worker_id body`` to START_LOG, then echoes the body; a body starting ``shed`` is
    shed (``Requeue``) at its first delivery."""
    if request.body.startswith(b"shed") and request.delivery_count == 0:
        raise Requeue()
    with open(os.environ["START_LOG"], "a") as log:
        log.write(f"{request.worker_id} {request.text()}\n")
    return request.body


_SHED_ONCE: set[str | None] = set()


def shed_once_and_show(request: Request) -> str:
    """A body ``shed`` is shed (``Requeue``) the first time this worker sees its correlation id; then
    the answer names what the handler was given: the user-id header and the ``when`` header's type."""
    if request.body == b"shed" and request.correlation_id not in _SHED_ONCE:
        _SHED_ONCE.add(request.correlation_id)
        raise Requeue()
    when = request.headers.get("when")
    return json.dumps({"user": request.headers.get("x-switchyard-user-id"), "when": type(when).__name__,
                       "count": request.delivery_count})
