"""Batched acks (``switchyard.rpc.worker.acks``): what a worker acks when, and what a crash redelivers.

Workers are real subprocesses on the real RabbitMQ (quorum request queues); a crash is SIGKILL.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from switchyard.core.errors import ConfigError
from switchyard.rpc import protocol
from switchyard.rpc.client import RpcClient
from switchyard.rpc.settings import RpcSettings
from switchyard.rpc.worker import WorkerConfig
from switchyard.rpc.worker.acks import AckBatch, batch_size
from tests.conftest import unique, wait_for
from tests.rpc.test_rpc import H, bind

LOGGED = f"{H}:logged"


def starts(log: Path) -> Counter[str]:
    """How many times each body was handled (by any worker)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split(" ", 1)[1] for line in lines)


def crash_and_replace(workers, proc, name: str, settings: RpcSettings, env: dict[str, str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    workers.procs.remove(proc)  # killed on purpose: not a failure to report
    workers.start(name, "k", LOGGED, worker_id=unique("next"), **env)
    workers.wait_consuming(settings, protocol.request_queue(name, "k"))


def test_calls_one_at_a_time_are_acked_per_prefetch_minus_one_and_a_crash_redelivers_the_rest(
        pool, workers, tmp_path: Path) -> None:
    """Prefetch 4: three answers share one ack. Two answered requests whose batch was not sent
    yet (a delay of a minute) are handled again after a crash: done twice, never lost; the three
    acked ones are not."""
    name, settings = pool
    bind(name, settings, "k")
    log = tmp_path / "starts.log"
    env = {"START_LOG": str(log), "WORKER_PREFETCH": "4", "WORKER_ACK_DELAY_MS": "60000"}
    first = workers.start(name, "k", LOGGED, worker_id=unique("first"), **env)
    workers.wait_consuming(settings, protocol.request_queue(name, "k"))
    with RpcClient(name, settings, timeout=20) as client:
        for body in ("a1", "a2", "a3"):  # the third answer sends the batch's one ack
            assert client.call("k", body).body == body.encode()
        crash_and_replace(workers, first, name, settings, env)
        second = workers.procs[-1]
        for body in ("b1", "b2"):  # answered; their batch waits for a third or a minute
            assert client.call("k", body).body == body.encode()
        crash_and_replace(workers, second, name, settings, env)
        wait_for(lambda: starts(log)["b2"] == 2, timeout=15, what="the unacked answers redelivered")
        time.sleep(0.5)  # window: anything else redelivered would be handled by now
    assert starts(log) == Counter({"a1": 1, "a2": 1, "a3": 1, "b1": 2, "b2": 2})


@pytest.mark.parametrize(("delay_ms", "wait_s"), [("50", 0.5), ("0", 0.0)])
def test_an_answer_is_acked_within_the_delay(pool, workers, tmp_path: Path, delay_ms: str,
                                             wait_s: float) -> None:
    """An idle worker does not sit on its acks: 50 ms after the answer a crash redelivers nothing.
    ``WORKER_ACK_DELAY_MS=0``: the ack leaves with the reply, so a crash right after the caller
    has its answer redelivers nothing either."""
    name, settings = pool
    bind(name, settings, "k")
    log = tmp_path / "starts.log"
    env = {"START_LOG": str(log), "WORKER_PREFETCH": "4", "WORKER_ACK_DELAY_MS": delay_ms}
    first = workers.start(name, "k", LOGGED, worker_id=unique("first"), **env)
    workers.wait_consuming(settings, protocol.request_queue(name, "k"))
    with RpcClient(name, settings, timeout=20) as client:
        assert client.call("k", "once").ok
        time.sleep(wait_s)  # window: the 50 ms ack delay runs out (an ack is not visible from outside)
        crash_and_replace(workers, first, name, settings, env)
        assert client.call("k", "after").ok  # the new worker serves; "once" would come first
    assert starts(log) == Counter({"once": 1, "after": 1})


def test_a_shed_request_among_batched_answers_settles_once(pool, workers, tmp_path: Path) -> None:
    """A multiple ack settles every delivery up to its tag: one covering a shed request's original
    before its copy is confirmed would make the confirm's ack an unknown tag, and the broker would
    close the channel. Shed requests amid calls in runs and one at a time: every call is answered
    once, and the worker keeps its one channel (no error, still running)."""
    name, settings = pool
    bind(name, settings, "k")
    log = tmp_path / "starts.log"
    env = {"START_LOG": str(log), "WORKER_PREFETCH": "4", "WORKER_ACK_DELAY_MS": "60000"}
    worker = workers.start(name, "k", LOGGED, **env)
    workers.wait_consuming(settings, protocol.request_queue(name, "k"))
    bodies = [f"{'shed' if i % 3 == 1 else 'ok'}-{i}" for i in range(30)]
    with RpcClient(name, settings, timeout=20) as client:
        futures = [client.submit("k", body) for body in bodies[:15]]  # in runs
        assert [f.result(20).text() for f in futures] == bodies[:15]
        assert [client.call("k", body).text() for body in bodies[15:]] == bodies[15:]  # one at a time
        time.sleep(0.5)  # window: no stale (duplicate) response arrives
        assert client.stats.stale_responses == 0
    assert worker.poll() is None, worker.stderr.read().decode() if worker.poll() is not None else ""
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    stderr = worker.stderr.read().decode()
    assert "PRECONDITION_FAILED" not in stderr and "unknown delivery tag" not in stderr, stderr[-2000:]
    assert starts(log) == Counter(bodies)


class _Acks:
    """Records the acks AckBatch writes (the batching rule alone; the tests above run it on a broker)."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, bool]] = []
        self._impl = self

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.sent.append((tag, multiple))


def test_the_batching_rule() -> None:
    channel = _Acks()
    acks = AckBatch(3, delay=1.0)
    for tag in (1, 2, 3):  # one at a time: three to a batch
        acks.add(channel, tag, now=0.0, waiting=False)  # type: ignore[arg-type]
    assert channel.sent == [(3, True)]
    acks.add(channel, 4, now=10.0, waiting=True)  # a run: held until its last answer
    acks.add(channel, 5, now=10.0, waiting=True)
    assert channel.sent == [(3, True)]
    acks.add(channel, 6, now=10.0, waiting=True)  # ... or a full batch
    assert channel.sent == [(3, True), (6, True)]
    acks.add(channel, 7, now=10.0, waiting=False)  # the run's last: at once
    assert channel.sent[-1] == (7, False)
    acks.add(channel, 8, now=10.05, waiting=False)  # a run 50 ms ago: still runs, at once
    assert channel.sent[-1] == (8, False)
    acks.add(channel, 9, now=20.0, waiting=False)  # one at a time again: held ...
    assert len(acks) == 1 and acks.due == 21.0
    acks.add(channel, 10, now=21.5, waiting=False)  # ... until due
    assert channel.sent[-1] == (10, True) and len(acks) == 0


@pytest.mark.parametrize(("prefetch", "delay_ms", "size"), [(1, 5, 1), (2, 5, 1), (3, 5, 2), (4, 5, 3),
                                                            (10, 5, 9), (4, 0, 1)])
def test_batch_size(prefetch: int, delay_ms: float, size: int) -> None:
    assert batch_size(prefetch, delay_ms) == size


@pytest.mark.parametrize("value", ["-1", "60001", "nan", "soon"])
def test_a_bad_ack_delay_is_a_clear_config_error(value: str) -> None:
    env = {"WORKER_POOL": "p", "WORKER_KEY": "k", "WORKER_ACK_DELAY_MS": value}
    with pytest.raises(ConfigError, match="WORKER_ACK_DELAY_MS must be ms from 0 to 60000"):
        WorkerConfig.from_env(RpcSettings(), env)
