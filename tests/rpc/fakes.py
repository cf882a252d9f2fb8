"""Fake adapters of ``switchyard.rpc.ports`` for the control logic's unit tests: a pool's request
queues, the dead-lettering probe and a worker group driver, in memory (no broker). The pool store
stays the real one on Redis (``store.PoolState``): its semantics live in Lua scripts, and a copy
here would test the copy."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from switchyard.rpc import protocol
from switchyard.rpc.errors import TopologyError
from switchyard.rpc.ports import WorkerGroup, WorkerGroupDriver


@dataclass
class FakeQueue:
    key: str
    messages: int = 0
    consumers: int = 0
    bound: bool = False
    listed: dict[str, Any] = field(default_factory=dict)  # extra management columns (members, state...)
    answers: bool = True  # answers a consume (False: a leaderless queue)


class FakeQueues:
    """``ports.RequestQueues`` in memory; ``fail`` names the operations that raise ``TopologyError``."""

    def __init__(self, pool: str, queue_type: protocol.QueueType = protocol.QueueType.QUORUM) -> None:
        self.pool = pool
        self._queue_type = queue_type
        self.queues: dict[str, FakeQueue] = {}  # queue name -> queue
        self.foreign: list[str] = []  # names under the pool's request prefix that no key makes
        self.fail: set[str] = set()
        self.calls: list[tuple[str, str]] = []  # (operation, key or queue), in order

    @property
    def queue_type(self) -> protocol.QueueType:
        return self._queue_type

    def add(self, key: str, *, messages: int = 0, consumers: int = 0, bound: bool = True,
            **listed: Any) -> FakeQueue:
        queue = FakeQueue(key, messages, consumers, bound, dict(listed))
        self.queues[protocol.request_queue(self.pool, key)] = queue
        return queue

    def get(self, key: str) -> FakeQueue | None:
        return self.queues.get(protocol.request_queue(self.pool, key))

    def _call(self, operation: str, what: str) -> None:
        self.calls.append((operation, what))
        if operation in self.fail:
            raise TopologyError(f"{operation} {what!r}: refused (fake)")

    def list_request_queues(self, columns: str) -> list[dict[str, Any]]:
        self._call("list", self.pool)
        listed = [{"name": name, "messages": q.messages, "arguments": {protocol.KEY_QUEUE_ARGUMENT: q.key},
                   **q.listed} for name, q in self.queues.items()]
        return listed + [{"name": name, "messages": 0, "arguments": {}} for name in self.foreign]

    def queue_status(self, queue: str) -> tuple[int, int] | None:
        self._call("status", queue)
        found = self.queues.get(queue)
        return None if found is None else (found.messages, found.consumers)

    def ensure_request_queue(self, key: str, bind: bool = True) -> str:
        self._call("ensure", key)
        name = protocol.request_queue(self.pool, key)
        queue = self.queues.setdefault(name, FakeQueue(key))
        queue.bound = queue.bound or bind
        return name

    def ensure_request_queues(self, keys: Iterable[str], likely_new: Iterable[str] = (),
                              parallel: int = 8) -> None:
        for key in dict.fromkeys([*likely_new, *keys]):
            self.ensure_request_queue(key)

    def unbind_request_queue(self, key: str) -> None:
        self._call("unbind", key)
        queue = self.get(key)
        if queue is not None:
            queue.bound = False

    def delete_request_queue(self, key: str) -> None:
        self._call("delete", key)
        self.queues.pop(protocol.request_queue(self.pool, key), None)

    def answers_consume(self, queue: str, timeout_s: float) -> bool:
        self._call("consume", queue)
        found = self.queues.get(queue)
        return found is None or found.answers


class FakeProbe:
    """``ports.DeadLetteringProbe``: says ``stranded``, or raises ``error``; counts its probes."""

    def __init__(self, broker: str = "fake-broker", stranded: bool = False,
                 error: Exception | None = None) -> None:
        self.broker = broker
        self._stranded, self.error = stranded, error
        self.probes = 0

    def stranded(self) -> bool:
        self.probes += 1
        if self.error is not None:
            raise self.error
        return self._stranded


class FakeDriver(WorkerGroupDriver):
    """Runs nothing, remembers which groups run and how each was scaled; ``fail``: keys it refuses."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.scaled: dict[str, int] = {}
        self.fail: set[str] = set()

    def start(self, group: WorkerGroup) -> None:
        if group.key in self.fail:
            raise RuntimeError(f"cannot start {group.key!r} (fake)")
        self.running.add(group.key)

    def stop(self, group: WorkerGroup) -> None:
        self.running.discard(group.key)

    def list_running(self, pool: str) -> set[str]:
        return set(self.running)

    def scale(self, group: WorkerGroup, backlog: int) -> int:
        self.scaled[group.key] = backlog
        return 1
