"""What one Spark partition needs from outside: something that calls a pool, something that schedules.

``calls`` and ``schedule`` see only these protocols; ``service`` builds the adapters from settings
(a slotted ``RpcClient`` per pool with publisher confirms; a confluent-kafka ``Producer`` on the
delay scheduler's input topic). Both are made inside the task, lazily: a partition without a row
for them opens no connection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from switchyard.rpc.client import Response


class PoolCaller(Protocol):
    """Calls to one pool's workers, many in flight; each future fails with an RpcError or BrokerError."""

    def submit(self, key: str, body: bytes, *, timeout: float,
               headers: Mapping[str, Any] | None = None) -> Future[Response]:
        """A call: the future resolves to the worker's (or the dead-lettering broker's) answer."""
        ...

    def send(self, key: str, body: bytes, *, timeout: float,
             headers: Mapping[str, Any] | None = None) -> Future[None]:
        """A request without reply-to: the future resolves once the broker confirmed it."""
        ...

    def close(self) -> None: ...


class DelayProducer(Protocol):
    """Produces scheduled rows to the delay scheduler's input topic, with delivery reports."""

    def produce(self, topic: str, *, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]],
                on_delivery: Callable[[object, object], None]) -> None:
        """Queue one record (BufferError: the local queue is full, poll then try again)."""
        ...

    def poll(self, timeout: float) -> int:
        """Serve delivery reports for up to ``timeout`` seconds."""
        ...

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for every outstanding delivery report; returns those left."""
        ...


ConnectPool = Callable[[str], PoolCaller]  # a pool's name -> a caller (one per pool and partition)
ConnectProducer = Callable[[], DelayProducer]
