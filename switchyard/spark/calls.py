"""One Spark partition's calls: a caller per pool (``ports.PoolCaller``), many in flight, bounded retries.

Runs inside a task (no Spark import here). Every request yields exactly one results row, in the
order answers arrive. With ``reply=False`` requests go without reply-to (``RpcClient.send``) and a
row is final (``sent``) once the broker confirms it. Retried: timeouts, unanswered dead letters
(TTL, full queue) and broker failures (lost connection, nack, return), at most ``retries`` times
more, with a short backoff.
A worker's own error answer (``error``) and poison (``delivery_limit``) are final at once.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, cast

from switchyard.core.errors import BrokerError, RpcError, SwitchyardError
from switchyard.core.tracing import TRACEPARENT_HEADER
from switchyard.rpc import protocol
from switchyard.rpc.client import Response
from switchyard.rpc.errors import CallTimeoutError
from switchyard.spark.ports import ConnectPool, PoolCaller
from switchyard.spark.rows import Request, Status, result_row

_BACKOFF_S = (0.1, 0.5, 1.0, 2.0)
# Looked up by a response's status, a str (protocol.Status is a StrEnum: its members hash as their values).
_RETRIED_ANSWERS: dict[str, Status] = {protocol.Status.EXPIRED: Status.EXPIRED,
                                       protocol.Status.MAXLEN: Status.MAXLEN}
_FINAL_ANSWERS: dict[str, Status] = {protocol.Status.OK: Status.OK, protocol.Status.ERROR: Status.ERROR,
                                     protocol.Status.DELIVERY_LIMIT: Status.DELIVERY_LIMIT,
                                     protocol.Status.REJECTED: Status.REJECTED}


@dataclass(frozen=True)
class CallOptions:
    """How a partition calls: per-call timeout, retries after the first attempt, calls in flight."""

    timeout_s: float = 30.0
    retries: int = 2
    concurrency: int = 64
    reply: bool = True  # False: send without reply-to; done when the broker confirms
    reply_queue: str | None = None  # scheduled rows: the durable reply queue (full name) of their answers


@dataclass
class _Attempt:
    request: Request
    attempts: int = 0
    started: float = 0.0


def _outcome(future: Future[Response | None]) -> tuple[Status, bytes | None, str | None, bool]:
    """(status, response body, error text, retry?) of one finished attempt."""
    try:
        response = future.result()
    except CallTimeoutError as exc:
        return Status.TIMEOUT, None, str(exc), True
    except (RpcError, BrokerError) as exc:  # broker lost, nacked or returned it; client reconnecting
        return Status.FAILED, None, f"{type(exc).__name__}: {exc}", True
    if response is None:  # RpcClient.send: the broker confirmed it
        return Status.SENT, None, None, False
    if response.status in _FINAL_ANSWERS:
        status = _FINAL_ANSWERS[response.status]
        return status, response.body, None if status is Status.OK else response.text()[:1000], False
    retried = _RETRIED_ANSWERS.get(response.status, Status.FAILED)
    return retried, response.body, f"dead-lettered: {response.status}", True


def call_partition(
    requests: Iterable[Request],
    options: CallOptions,
    connect: ConnectPool,
    on_result: Callable[[tuple], None] | None = None,
    before_send: Callable[[Request], None] | None = None,
) -> Iterator[tuple]:
    """Call every request through ``connect(pool)``'s callers; yield one results row each
    (``rows.RESULT_FIELDS``). The callers are closed when the partition ends.

    ``on_result`` sees every row (progress counters); ``before_send`` every request before its first
    attempt (a hook: an exception there fails the task, as a lost executor would).
    """
    clients: dict[str, PoolCaller] = {}
    # A call's future holds a Response (submit) or None (send, without a reply).
    done: queue.SimpleQueue[tuple[_Attempt, Future[Any]]] = queue.SimpleQueue()
    source = iter(requests)
    waiting: list[tuple[float, int, _Attempt]] = []  # retries: a heap by when they may go
    order = itertools.count()
    in_flight = 0
    exhausted = False

    def client_for(pool: str) -> PoolCaller:
        if pool not in clients:
            clients[pool] = connect(pool)
        return clients[pool]

    def send(attempt: _Attempt) -> tuple | None:
        """Submit one attempt; a row if it failed at once and has no retry left."""
        nonlocal in_flight
        attempt.attempts += 1
        attempt.started = time.monotonic()
        request = attempt.request
        future: Future[Any]
        try:
            client = client_for(request.pool)
            headers = {TRACEPARENT_HEADER: request.traceparent} if request.traceparent else None
            if options.reply:
                future = client.submit(request.key, request.body, timeout=options.timeout_s, headers=headers)
            else:
                future = client.send(request.key, request.body, timeout=options.timeout_s, headers=headers)
        except SwitchyardError as exc:  # no connection for a client yet, or the client closed
            return settle(attempt, Status.FAILED, None, f"{type(exc).__name__}: {exc}", True)
        in_flight += 1
        # mypy cannot type a lambda whose default binds the attempt
        future.add_done_callback(lambda f, a=attempt: done.put((a, f)))  # type: ignore[misc]
        return None

    def settle(attempt: _Attempt, status: Status, body: bytes | None, error: str | None,
               retry: bool) -> tuple | None:
        if retry and attempt.attempts <= options.retries:
            delay = _BACKOFF_S[min(attempt.attempts - 1, len(_BACKOFF_S) - 1)]
            not_before = time.monotonic() + (delay if status is Status.FAILED else 0.0)
            heapq.heappush(waiting, (not_before, next(order), attempt))
            return None
        latency = round((time.monotonic() - attempt.started) * 1000, 3)
        row = result_row(attempt.request, status, attempt.attempts, latency, body, error)
        if on_result is not None:
            on_result(row)
        return row

    try:
        while True:
            while in_flight < options.concurrency:
                now = time.monotonic()
                if waiting and waiting[0][0] <= now:
                    row = send(heapq.heappop(waiting)[2])
                elif not exhausted:
                    request = next(source, None)
                    if request is None:
                        exhausted = True
                        continue
                    if before_send is not None:
                        before_send(request)
                    row = send(_Attempt(request))
                else:
                    break
                if row is not None:
                    yield row
            if in_flight == 0 and not waiting and exhausted:
                return
            wait = 0.2
            if waiting and in_flight < options.concurrency:
                wait = max(0.001, min(wait, waiting[0][0] - time.monotonic()))
            try:
                attempt, future = done.get(timeout=wait) if in_flight else (None, None)
            except queue.Empty:
                continue
            if attempt is None:
                time.sleep(wait)
                continue
            in_flight -= 1
            row = settle(attempt, *_outcome(cast("Future[Response | None]", future)))  # got with attempt
            if row is not None:
                yield row
    finally:
        for client in clients.values():
            client.close()
