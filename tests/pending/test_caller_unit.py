"""The caller's decisions on what its store reports, with a fake adapter (no Redis): each state a
beat or a wait returns leads where it should. The Redis adapter's own behaviour is the other
suites' (real Redis, no mocks)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from switchyard.pending.caller import Caller
from switchyard.pending.errors import CancelledError, DataLossError, PickupTimeoutError, ProcessorLostError
from switchyard.pending.model import CancelToken, IdSource
from switchyard.pending.ports import (
    AnswerWait,
    CallerBeatReply,
    NodeContext,
    RequestState,
    WaitOutcome,
    WithdrawOutcome,
    WithdrawReply,
)
from switchyard.pending.settings import PendingSettings
from switchyard.pending.wakeup import Signal
from tests.pending.conftest import FAST


class FakeSubscriber:
    """Waits on the caller's own signal: no node channel, nothing arrives on it."""

    def wait(self, signal: Signal, timeout: float, ready: Callable[[], bool]) -> bool:
        return signal.wait(timeout)


class FakeStore:
    """The caller's half of ``PendingStore``: a scripted wait and beats, the calls recorded."""

    node_id = "n" * 32

    def __init__(self, wait: AnswerWait, beats: list[CallerBeatReply],
                 withdraw: WithdrawReply | None = None) -> None:
        self.wait, self.beats = wait, beats
        self.withdraw_reply = withdraw or WithdrawReply(WithdrawOutcome.WITHDRAWN, None)
        self.calls: list[str] = []
        self.interrupted: list[str] = []
        self.in_wait = threading.Event()
        self.release = threading.Event()

    def enqueue_and_wait(self, endpoint: str, request_id: str, element: bytes, pickup_timeout_s: float,
                         wait_s: float, ready: Callable[[], bool], queued: Callable[[], None]) -> AnswerWait:
        self.calls.append("enqueue_and_wait")
        queued()
        if self.wait.outcome is WaitOutcome.BROKEN:  # a wait an interruption ends
            self.in_wait.set()
            self.release.wait(5)
        return self.wait

    def interrupt_wait(self, request_id: str) -> None:
        self.interrupted.append(request_id)
        self.release.set()

    def caller_beat(self, endpoint: str, request_id: str, element: bytes) -> CallerBeatReply:
        self.calls.append("beat")
        return self.beats.pop(0) if self.beats else CallerBeatReply(RequestState.TAKEN, 0, b"")

    def withdraw(self, endpoint: str, request_id: str, element: bytes, mode: str) -> WithdrawReply:
        self.calls.append(f"withdraw {mode}")
        return self.withdraw_reply


def caller(store: FakeStore, data_lost: bool = False, **settings: Any) -> Caller:
    node = NodeContext(PendingSettings(**{**FAST, **settings}), store, FakeSubscriber(),  # type: ignore[arg-type]
                       IdSource(), lambda: data_lost, lambda _step: None)
    return Caller(node, None, collect=lambda _endpoint, _id: None)


def test_a_response_within_the_wait_needs_no_beat() -> None:
    store = FakeStore(AnswerWait(WaitOutcome.ANSWERED, b'{"ok":true,"body":7}'), [])
    assert caller(store).queue_and_wait("ep", 1, None, None, None).body == 7
    assert store.calls == ["enqueue_and_wait"]


@pytest.mark.parametrize("outcome", [WaitOutcome.TIMED_OUT, WaitOutcome.NOT_WAITED])
def test_an_answer_found_by_a_beat_is_the_response(outcome: WaitOutcome) -> None:
    answered = CallerBeatReply(RequestState.ANSWERED, 0, b'{"ok":true,"body":"b"}')
    store = FakeStore(AnswerWait(outcome), [answered])
    assert caller(store).queue_and_wait("ep", 1, None, None, None).body == "b"
    assert store.calls == ["enqueue_and_wait", "beat"]


@pytest.mark.parametrize("data_lost,message", [(True, "lost its data"), (False, "gone from Redis")])
def test_a_missing_state_is_data_loss(data_lost: bool, message: str) -> None:
    store = FakeStore(AnswerWait(WaitOutcome.TIMED_OUT), [CallerBeatReply(RequestState.MISSING, 0, b"")])
    with pytest.raises(DataLossError, match=message):
        caller(store, data_lost).queue_and_wait("ep", 1, None, None, None)


def test_a_silent_processor_is_lost_and_its_request_withdrawn() -> None:
    store = FakeStore(AnswerWait(WaitOutcome.TIMED_OUT), [CallerBeatReply(RequestState.TAKEN, 5000, b"")])
    with pytest.raises(ProcessorLostError, match="no heartbeat for 5 s"):
        caller(store, processor_timeout_s=1.0).queue_and_wait("ep", 1, None, None, None)
    assert store.calls == ["enqueue_and_wait", "beat", "withdraw cancel"]


def test_a_requeued_request_restarts_its_pickup_timeout() -> None:
    """Beats at 0.1, 0.3, 0.5 s...; the pickup timeout (0.7 s) would withdraw the request before a
    4th beat; the 3rd beat's requeue restarts it, so more beats come before the withdrawal."""
    queued = CallerBeatReply(RequestState.QUEUED, 0, b"")
    store = FakeStore(AnswerWait(WaitOutcome.NOT_WAITED),
                      [queued, queued, CallerBeatReply(RequestState.REQUEUED, 0, b"")] + [queued] * 20)
    with pytest.raises(PickupTimeoutError):
        caller(store, pickup_timeout_s=0.7).queue_and_wait("ep", 1, None, None, None)
    assert store.calls.count("beat") >= 4, store.calls
    assert store.calls[-1] == "withdraw timeout"


def test_a_cancel_interrupts_the_answer_wait_and_withdraws() -> None:
    store = FakeStore(AnswerWait(WaitOutcome.BROKEN), [], WithdrawReply(WithdrawOutcome.WITHDRAWN, None))
    token = CancelToken()
    threading.Thread(target=lambda: store.in_wait.wait(5) and token.cancel("not needed"), daemon=True).start()
    with pytest.raises(CancelledError, match=r"before pickup.*not needed"):
        caller(store).queue_and_wait("ep", 1, None, None, token)
    assert len(store.interrupted) == 1
    assert store.calls == ["enqueue_and_wait", "withdraw cancel"]
