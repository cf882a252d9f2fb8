"""A Redis Cluster master SIGKILLed under traffic: pending calls and bus events on a private
3-master / 3-replica cluster (``tests/redis_cluster.py``) while the master holding the bus's slot
and the pending endpoint's (the endpoint is picked to share it) is killed, its replica promoted
after the node timeout (2 s), and the killed node started again as a replica (the full size kills
twice: the second time the promoted replica).

The caller and the processing node (``PendingQueue.serve``, 8 threads, ``WORK_S`` a request) run
in this process. A call that fails with an error of ``RETRYABLE`` was not answered and may or may
not have been handled: the harness re-sends it, as a caller should, up to ``ATTEMPTS`` times; a
call that ends in any other error, or is still unanswered after its attempts, is lost. Redis
replicates asynchronously, so a write the master acknowledged just before the kill can be missing
on the promoted replica: a request's state that vanished is caught by the caller's next beat
(``DataLossError``: "its state is gone"), an answer that vanished by the processor's lapsed beat
(``ProcessorLostError``), and both are re-sent. Every handling is counted: a request handled
twice (re-sent after its answer was lost) is a duplicate.

The bus (``bus.BusRig``: the API served here, a ``switchyard bus worker`` subprocess, two
subscribers) gets events published through the API at a steady rate; a publish answered 503
(storage unavailable: the failover) is published again for up to ``RESEND_WINDOW_S``. An event must
reach both subscribers; one that arrives twice (a publish whose answer was lost, a batch whose
acknowledgement was) is a duplicate.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from switchyard.core.config import Connections
from switchyard.pending import (
    DataLossError,
    PendingQueue,
    PendingRequest,
    PendingSettings,
    PickupTimeoutError,
    ProcessorLostError,
    StoreUnavailableError,
)
from tests.conftest import unique, wait_for
from tests.faults.account import Account, recovery_after
from tests.faults.bus import BusRig
from tests.redis_cluster import PrivateRedisCluster

WORK_S = 0.05
SERVERS = 8  # processing threads
ATTEMPTS = 5  # of a call (each waits out the pending queue's own 30 s retry window)
# A bus event answered 503 is published again every RESEND_PAUSE_S, for up to RESEND_WINDOW_S (the
# API answers 503 while the slot has no master: the node timeout and the election).
RESEND_PAUSE_S = 0.25
RESEND_WINDOW_S = 30.0
# Not answered, perhaps handled: safe to send again (at-least-once, the handler idempotent).
RETRYABLE = (DataLossError, ProcessorLostError, StoreUnavailableError, PickupTimeoutError)


@dataclass(frozen=True)
class FailoverSize:
    requests: int
    events: int  # bus events, published over about as long as the calls take
    rate: float  # bus events per second
    callers: int = 16  # calls waiting at once
    kills: tuple[float, ...] = (0.3,)  # of the calls sent (and of the events published)


SIZES = {"full": FailoverSize(requests=3000, events=3000, rate=120, kills=(0.25, 0.6)),
         "short": FailoverSize(requests=400, events=400, rate=120)}


def cluster_connections(cluster: PrivateRedisCluster) -> Connections:
    return Connections(redis_url=cluster.url, redis_cluster=True, redis_timeout_s=2.0)


def cluster_settings(cluster: PrivateRedisCluster) -> PendingSettings:
    """Beats every 0.5 s so a state lost in the failover is found soon; a processor presumed lost
    after 6 s, longer than a failover, so a live one is never given up on while its Redis moves."""
    return PendingSettings(prefix=unique("faults-rc"), connections=cluster_connections(cluster),
                           heartbeat_initial_delay_s=0.5, heartbeat_interval_s=0.5, processor_timeout_s=6.0,
                           sender_timeout_s=20.0, data_loss_check_s=1.0, retry_interval_s=0.25,
                           retry_window_s=30.0)


class FailoverRig:
    """The private cluster; a caller node and a processing node on it, serving an endpoint whose
    slot is on the bus's master; the bus rig on it. That master is never the node the clients were
    pointed at (it must answer a client starting: in production, the configuration endpoint)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.cluster = PrivateRedisCluster(workdir / unique("redis-cluster"))
        self.handled: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.stop_serving = threading.Event()

    def _handle(self, request: PendingRequest) -> object:
        with self._lock:
            self.handled[request.body] += 1
        time.sleep(WORK_S)
        return request.body

    def __enter__(self) -> FailoverRig:
        self.cluster.start()
        self.admin = self.cluster.client()
        first = self.cluster.ports[0]
        while True:  # a bus whose slot is not on the first node (its name is random)
            bus = BusRig(self.workdir, cluster_connections(self.cluster))
            if self.cluster.master_of(self.admin, bus.store.prefix).port != first:
                break
            bus.store.redis.close()
        self.bus, self.tag = bus, bus.store.prefix
        bus_master = self.cluster.master_of(self.admin, self.tag).port
        self.endpoint = next(e for e in (f"failover{i}" for i in range(1000))
                             if self.cluster.master_of(self.admin, f"{{{e}}}").port == bus_master)
        self.bus.__enter__()
        settings = cluster_settings(self.cluster)
        self.caller = PendingQueue(settings).start()
        self.processor = PendingQueue(settings).start()
        for _ in range(SERVERS):
            threading.Thread(target=self.processor.serve,
                             args=(self.endpoint, self._handle, self.stop_serving), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_serving.set()
        self.caller.close()
        self.processor.close()
        self.bus.__exit__(*exc)
        self.admin.close()
        self.cluster.stop()

    def kill_master(self) -> tuple[float, float]:
        """SIGKILL the master of the bus and the endpoint; once its replica serves the slot, start
        it again (it rejoins as a replica). Returns when it was killed and when the replica took over."""
        port, killed = self.cluster.kill_master_of(self.admin, self.tag)
        wait_for(lambda: self.cluster.promoted(self.admin, self.tag, port), timeout=60, interval=0.05,
                 what=f"a replica promoted in place of :{port}")
        promoted = time.monotonic()
        self.cluster.start_node(port)
        return killed, promoted


class Traffic:
    """The calls and the events, each re-sent on a retryable failure; what became of them."""

    def __init__(self, rig: FailoverRig, size: FailoverSize) -> None:
        self.rig, self.size = rig, size
        self.answers: Counter[str] = Counter()
        self.resent: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.called_at: dict[str, float] = {}  # call id -> first sent
        self.answered_at: dict[str, float] = {}
        self.published_at: dict[int, float] = {}  # event -> first published
        self._lock = threading.Lock()  # the counters, shared by the calling threads

    def count(self, counter: Counter[str], name: str) -> None:
        with self._lock:
            counter[name] += 1

    def call(self, rid: str) -> None:
        self.called_at[rid] = time.monotonic()
        for _ in range(ATTEMPTS):
            try:
                if self.rig.caller.queue_and_wait(self.rig.endpoint, rid).body == rid:
                    self.answers[rid] += 1
                    self.answered_at[rid] = time.monotonic()
                return
            except RETRYABLE as exc:
                self.count(self.resent, type(exc).__name__)
            except Exception as exc:
                self.count(self.failures, type(exc).__name__)
                return
        self.count(self.failures, "calls' attempts spent")

    def publish_all(self) -> None:
        start, bus = time.monotonic(), self.rig.bus
        for n in range(self.size.events):
            time.sleep(max(0.0, start + n / self.size.rate - time.monotonic()))
            self.published_at[n] = time.monotonic()
            give_up = time.monotonic() + RESEND_WINDOW_S
            while (status := bus.post_event(n).status_code) == 503 and time.monotonic() < give_up:
                self.count(self.resent, "bus 503")
                time.sleep(RESEND_PAUSE_S)
            if status != 200:
                self.count(self.failures, f"bus {status}")


def run_failover(scenario: str, size: FailoverSize, workdir: Path) -> Account:
    with FailoverRig(workdir) as rig:
        traffic = Traffic(rig, size)
        ids = [f"c{n}" for n in range(size.requests)]
        kills: list[tuple[float, float]] = []
        start = time.monotonic()
        publisher = threading.Thread(target=traffic.publish_all, daemon=True)
        publisher.start()
        with ThreadPoolExecutor(size.callers) as pool:
            futures = [pool.submit(traffic.call, rid) for rid in ids]
            for fraction in size.kills:
                wait_for(lambda fraction=fraction: len(traffic.called_at) >= fraction * size.requests
                         and len(traffic.published_at) >= fraction * size.events, timeout=120, interval=0.01,
                         what="calls and events under way")
                kills.append(rig.kill_master())
            for future in futures:
                future.result()
        publisher.join(300)
        expected = rig.bus.expected(size.events)
        arrivals, arrived = rig.bus.wait_arrivals(expected)
        # A call answered: how often it was handled; one that ended in an error is lost, handled or not.
        seen = {rid: max(traffic.answers[rid], rig.handled[rid]) if traffic.answers[rid] else 0
                for rid in ids}
        seen.update(arrivals)
        sent_at = {**traffic.called_at,
                   **{key: traffic.published_at[int(key.partition(":")[2])] for key in expected}}
        notes = [f"{what}: " + ", ".join(f"{name} x{count}" for name, count in sorted(counts.items()))
                 for what, counts in (("re-sent", traffic.resent), ("lost", traffic.failures)) if counts]
        notes.append(f"data-loss events {rig.caller.data_loss_events + rig.processor.data_loss_events}")
        return Account.settle(scenario, [*ids, *sorted(expected)], seen, time.monotonic() - start, len(kills),
                              "; ".join(notes),
                              recovery_after(kills, sent_at, {**traffic.answered_at, **arrived}))
