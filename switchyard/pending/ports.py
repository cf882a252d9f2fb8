"""What the pending queue's services need from Redis, as protocols: the store and its subscriber.

The caller's side (``caller.py``), the processing side (``processor.py``), the watcher
(``watcher.py``) and the node API (``api.py``) only see these; ``store.py`` is the Redis adapter
(keys and their hash tags, the Lua scripts of ``lua/``, blocking pops, the batched round trips).

Errors: an operation raises ``StoreUnavailableError`` when Redis stayed unreachable for the retry
window, and ``PendingError`` when Redis refused it (out of memory, a key of the wrong type), the
driver's error as its ``__cause__``: the adapter translates, so no service module knows the driver.
State codes are ``StrEnum``s (``RequestState``, ``ProcessorState``, ``WaitOutcome``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from switchyard.pending.settings import PendingSettings
from switchyard.pending.wakeup import Signal


class RequestState(StrEnum):
    """A request's state as a caller's beat reports it (the codes the Lua scripts write in ``s``,
    and what the beat itself did or found)."""

    QUEUED = "q"
    TAKEN = "t"
    ANSWERED = "a"
    REQUEUED = "requeued"  # popped and never claimed for the processor timeout: back in the queue
    MISSING = "missing"  # the state is gone (expired or lost)


class ProcessorState(StrEnum):
    """What a processor's beat found: the request taken (by it) or why it holds none."""

    TAKEN = "t"
    MISSING = "missing"
    NOT_TAKER = "not_taker"


class WaitOutcome(StrEnum):
    """How a caller's wait on its answer list ended (``PendingStore.enqueue_and_wait``)."""

    ANSWERED = "answered"  # the response came within the wait
    TIMED_OUT = "timed_out"  # none within the wait: the caller's next beat ends the list wait
    NOT_WAITED = "not_waited"  # queued without a list wait: the response comes on the node channel
    BROKEN = "broken"  # the wait failed or was interrupted (queued all the same): beat now


class AnswerWait(NamedTuple):
    """A caller's enqueue and its wait on its answer list; ``response`` when ``ANSWERED``."""

    outcome: WaitOutcome
    response: bytes | None = None


class CallerBeatReply(NamedTuple):
    """A caller's heartbeat: the request's state, ms since its processor's last beat (taken, else
    0), and the response (answered, else empty)."""

    state: RequestState
    processor_silence_ms: int
    response: bytes


class ProcessorBeatReply(NamedTuple):
    """A processor's heartbeat: the state (``missing`` or ``not_taker`` when it holds no request),
    ms since the caller's last beat, and whether the caller cancelled."""

    state: ProcessorState
    caller_silence_ms: int
    cancelled: bool


class WithdrawOutcome(StrEnum):
    """What a withdrawal did (withdraw.lua's replies)."""

    WITHDRAWN = "withdrawn"  # it was still waiting: gone now
    ANSWERED = "answered"  # a response beat the withdrawal (with the response)
    TAKEN = "taken"  # a timeout's: left to its processor
    CANCELLED = "cancelled"  # a cancel's after pickup: the processor told
    MISSING = "missing"


class WithdrawReply(NamedTuple):
    """A withdrawal's outcome, with the response when ``ANSWERED``."""

    outcome: WithdrawOutcome
    response: bytes | None


class Answer(NamedTuple):
    """A response to send with a poller's next pop; ``told`` gets a function returning what
    became of it (``Delivery``'s values) or raising why it could not be stored."""

    request_id: str
    take_id: str
    raw: bytes
    told: Callable[[Callable[[], str]], None]


class Subscriber(Protocol):
    """The node's one pub/sub connection; a waiting thread reads it when no other thread does."""

    def subscribe(self, channel: str) -> None: ...

    def wait(self, signal: Signal, timeout: float, ready: Callable[[], bool]) -> bool:
        """Block until ``signal`` is set (True) or ``timeout`` s passed (False)."""
        ...

    def run(self) -> None:
        """The listener thread's loop, until the node closes."""
        ...


class PendingStore(Protocol):
    """One node's view of the pending queue's state in Redis."""

    node_id: str
    node_channel: str

    def endpoint_channel(self, endpoint: str) -> str:
        """Where cancellations of an endpoint's popped, unclaimed requests are published."""
        ...

    def listen(self, dispatch: Callable[[dict[str, Any]], None], on_lost: Callable[[], None]) -> Subscriber:
        """The node channel's subscriber (``dispatch`` gets each message on the reading thread)."""
        ...

    # caller's side
    def enqueue(self, endpoint: str, request_id: str, element: bytes, pickup_timeout_s: float) -> None: ...

    def enqueue_and_wait(self, endpoint: str, request_id: str, element: bytes, pickup_timeout_s: float,
                         wait_s: float, ready: Callable[[], bool], queued: Callable[[], None]) -> AnswerWait:
        """Enqueue and wait up to ``wait_s`` for the response in the same write (a blocking pop on
        the call's answer list), when a waiting connection is free; else just enqueue
        (``NOT_WAITED``). ``queued`` runs once the request is queued; ``ready``: the call has
        something to act on (``interrupt_wait`` ends a wait begun after it was checked)."""
        ...

    def interrupt_wait(self, request_id: str) -> None:
        """End the answer-list wait of ``request_id`` now, if one runs (a cancel, an error)."""
        ...

    def caller_beat(self, endpoint: str, request_id: str, element: bytes) -> CallerBeatReply: ...

    def withdraw(self, endpoint: str, request_id: str, element: bytes, mode: str) -> WithdrawReply:
        """``mode``: ``timeout`` (take back only if nobody took it) or ``cancel``."""
        ...

    def unlink_answered(self, answered: Mapping[str, Sequence[str]]) -> None:
        """Remove answered states (endpoint -> request ids) in one round trip; a failure is logged
        (their TTL removes them)."""
        ...

    # processing side
    def pop(self, endpoint: str, take_id: str, deadline: float, answer: Answer | None = None) -> bytes | None:
        """The next request's element of ``endpoint``, moved into the take key, waiting until
        ``deadline`` (monotonic); None when none came or the node closes. ``answer``: a response
        of the previous request, sent in the same write as the pop (its outcome told first)."""
        ...

    def interrupt_pops(self) -> None:
        """End every blocking pop now (the node is closing)."""
        ...

    def respond(self, endpoint: str, request_id: str, take_id: str, raw: bytes) -> str:
        """Store a response and tell its caller; what became of it (``Delivery``'s values)."""
        ...

    def processor_beat(self, endpoint: str, request_id: str, take_id: str) -> ProcessorBeatReply: ...

    # watcher
    def swap_guards(self, token: str, ttl_s: float) -> dict[str, bytes | None]:
        """Set this node's data-loss guards (one per shard) to ``token``; by guard, the value it
        had (None: gone). A shard that does not answer is left out."""
        ...

    def guard_keys(self) -> dict[str, tuple[int, int]]:
        """Each guard and the slot range it watches."""
        ...

    def endpoint_in(self, endpoint: str, slots: tuple[int, int]) -> bool:
        """Whether ``endpoint``'s keys live in ``slots``."""
        ...

    # node API
    def take_poll_slot(self, endpoint: str, slot: str, lapses_at: float, key_ttl_ms: int, limit: int) -> bool:
        """Count a long poll of ``endpoint`` (until ``lapses_at``, epoch s); False (and not kept)
        when ``limit`` polls wait already."""
        ...

    def give_back_poll_slot(self, endpoint: str, slot: str) -> None: ...

    # admin
    def status(self) -> dict[str, Any]:
        """Queue depth, in-flight requests by state and oldest age, per endpoint."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class NodeContext:
    """What each side of a node (caller, processor) is given by the node that composes them."""

    settings: PendingSettings
    store: PendingStore
    subscriber: Subscriber
    new_id: Callable[[], str]  # request and take ids
    check_data_loss: Callable[[], bool]  # the watcher's guard check (on loss it fails everything)
    step: Callable[[str], None]  # the node's step hook (tests crash a process at a named step)
