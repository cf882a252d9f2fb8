"""RPC under faults: ``RpcClient`` calls over many keys through ``switchyard local`` and its workers.

Keys come into use gradually (the first 60 % of the run), so the orphan path (a new key's first
requests, forwarded by the control plane) is busy when a fault lands, not only the fast path. A call
is re-sent (same id) only when the client reports that its connection to the broker was lost, since
then its reply can never arrive, or that the broker refused it (a nack). Every handling is counted
by the worker (``handlers.count``), so a request worked on twice is a duplicate even though its
caller saw one answer. A request no worker ever handled is lost (timed out, or answered with a dead-
letter status); one handled but answered after its caller's timeout is late, not lost, and named in
the note.
"""

from __future__ import annotations

import math
import queue
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

import pika.exceptions

from switchyard.core.config import Connections
from switchyard.core.errors import BrokerUnavailableError
from switchyard.core.redis_client import connect_redis
from switchyard.rpc import RpcClient, protocol
from switchyard.rpc.amqp import connect
from switchyard.rpc.client import Response
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.errors import ClientBusyError, ClientClosedError, PublishRejectedError
from switchyard.rpc.settings import RpcSettings
from tests.conftest import ROOT, unique, wait_for
from tests.faults.account import Account, recovery_after
from tests.faults.handlers import FAULTS_REDIS_ENV, handled_key
from tests.faults.procs import Service, kill_pids, pids_with_env
from tests.rpc.conftest import flush_pool_state

# A nack is the broker saying it did not take the request: the caller knows, and sends it again.
RETRYABLE = (BrokerUnavailableError, ClientClosedError, ClientBusyError, PublishRejectedError)


@dataclass(frozen=True)
class RpcSize:
    requests: int
    keys: int
    rate: float  # requests per second
    # Per call, and how long the end of a run waits for the last answers: long enough that a
    # loaded machine's slow recovery is not mistaken for a loss (the machine has 2 cores).
    timeout: float = 60.0


class RpcTraffic:
    """Sends ``size.requests`` calls at ``size.rate`` from one client; counts answers per request id.
    ``retry=False``: a call whose caller sees an error is not sent again (a failure, in ``failures``)."""

    def __init__(self, pool: str, settings: RpcSettings, size: RpcSize, retry: bool = True) -> None:
        self.pool = pool
        self.settings = settings
        self.size = size
        self.retry = retry
        self.client: RpcClient | None = None  # while the traffic runs
        self.ids = [f"r{n}" for n in range(size.requests)]
        self.answers: Counter[str] = Counter()
        self.failures: dict[str, str] = {}
        self.resent = 0
        self.submitted = 0
        self.sent_at: dict[str, float] = {}  # first submit, time.monotonic()
        self.answered_at: dict[str, float] = {}  # first answer
        self.faults: list[tuple[float, float]] = []  # (start, end) of each fault, time.monotonic()
        self._pending = 0
        self._lock = threading.Lock()
        self._retry: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"traffic-{pool}", daemon=True)
        self.error: BaseException | None = None

    def key(self, rid: str) -> str:
        n = int(rid[1:])
        active = max(1, min(self.size.keys, 1 + n * self.size.keys * 10 // (6 * self.size.requests)))
        index = n % active
        return f"clé {index}" if index == 1 else f"fault-{index}"  # one key with a space, non-ASCII

    def start(self) -> RpcTraffic:
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def progress(self) -> float:
        return self.submitted / self.size.requests

    def wait_progress(self, fraction: float) -> None:
        wait_for(lambda: self.progress() >= fraction or not self._thread.is_alive(), math.inf, interval=0.02)

    def fault_over(self, started: float) -> None:
        """Mark a fault that began at ``started`` as over now (the service is back)."""
        self.faults.append((started, time.monotonic()))

    def recovery(self) -> float | None:
        """Seconds from a fault's end until the last call it held up was answered (``recovery_after``)."""
        return recovery_after(self.faults, self.sent_at, self.answered_at)

    def _run(self) -> None:
        try:
            with RpcClient(self.pool, self.settings, concurrency=64, timeout=self.size.timeout,
                           confirm=True, name="switchyard-faults") as client:
                self.client = client
                start = time.monotonic()
                for n, rid in enumerate(self.ids):
                    self._drain_retries(client)
                    delay = start + n / self.size.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)  # pace: size.rate requests a second
                    self._submit(client, rid)
                    self.submitted += 1
                wait_for(lambda: self._settled_all(client), 3 * self.size.timeout, interval=0.05,
                         required=False)
        except BaseException as exc:
            self.error = exc

    def _drain_retries(self, client: RpcClient) -> None:
        while not self._retry.empty():
            self.resent += 1
            self._submit(client, self._retry.get())

    def _settled_all(self, client: RpcClient) -> bool:
        """Whether every request is answered or failed (retries sent again meanwhile)."""
        self._drain_retries(client)
        with self._lock:
            return self._pending == 0 and self._retry.empty()

    def _submit(self, client: RpcClient, rid: str) -> None:
        with self._lock:
            self._pending += 1
        self.sent_at.setdefault(rid, time.monotonic())
        try:
            future = client.submit(self.key(rid), rid)
        except RETRYABLE as exc:
            if self.retry:
                time.sleep(0.2)  # pace: a caller's pause before it retries
            else:
                self.failures[rid] = f"{type(exc).__name__}: {exc}"
            self._settled(rid, None, retry=self.retry)
            return
        future.add_done_callback(lambda f, rid=rid: self._settled(rid, f))

    def _settled(self, rid: str, future: Future[Response] | None, retry: bool = False) -> None:
        if future is not None:
            exc = future.exception()
            if exc is None:
                response = future.result()
                if response.ok:
                    self.answers[rid] += 1
                    self.answered_at.setdefault(rid, time.monotonic())
                else:
                    self.failures[rid] = f"answered {response.status}"
            elif isinstance(exc, RETRYABLE) and self.retry:
                retry = True
            else:
                self.failures[rid] = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._pending -= 1
            if retry:
                self._retry.put(rid)


class RpcRig:
    """One throwaway pool with its control plane (``switchyard local``) as a subprocess."""

    def __init__(self, workdir: Path, connections: Connections | None = None,
                 plane_env: Mapping[str, str] | None = None) -> None:
        base = RpcSettings.from_env()
        self.settings = replace(base, connections=connections or base.connections)
        c = self.settings.connections
        self.pool = unique("faults")
        self.redis = connect_redis(c)
        self.plane = Service(
            ["local", "--pool", self.pool, "--status-every", "3600"],
            {"SWITCHYARD_AMQP_URL": c.amqp_url, "SWITCHYARD_MANAGEMENT_URL": c.management_url,
             "SWITCHYARD_REDIS_URL": c.redis_url,
             "SWITCHYARD_RPC_WORKER_HANDLER": "tests.faults.handlers:count",
             "SWITCHYARD_RPC_WORKER_LOG_DIR": str(workdir / "workers"),
             "SWITCHYARD_RPC_RECONCILE_INTERVAL_S": "0.5",
             "SWITCHYARD_RPC_MAX_WORKERS": "2", "SWITCHYARD_RPC_WORKER_STOP_TIMEOUT_S": "5",
             "WORKER_ACTIVITY_INTERVAL": "0.5", FAULTS_REDIS_ENV: c.redis_url, **(plane_env or {})},
            workdir / f"local-{self.pool}.log", tag=self.pool)

    def workers(self) -> list[int]:
        return pids_with_env("WORKER_POOL", self.pool)

    def __enter__(self) -> RpcRig:
        with PoolTopology(self.pool, self.settings) as topology:
            topology.declare()
        self.plane.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.plane.stop()
        kill_pids(self.workers())
        with PoolTopology(self.pool, self.settings) as topology:
            topology.delete(force=True)
        flush_pool_state(self.redis, self.pool)
        self.redis.delete(handled_key(self.pool))
        self.redis.close()

    def queued(self, queues: list[str]) -> int:
        """Messages waiting in these queues now (a lost request still queued was only slow)."""
        connection = connect(self.settings.connections.amqp_url, "switchyard-faults-queued")
        total = 0
        try:
            for queue in queues:
                channel = connection.channel()
                try:
                    total += channel.queue_declare(queue, passive=True).method.message_count
                    channel.close()
                except pika.exceptions.ChannelClosedByBroker:
                    pass  # no such queue
        finally:
            connection.close()
        return total

    def handled(self) -> dict[str, int]:
        """How many times a worker handled each request id (``handlers.count``)."""
        return {k.decode(): int(v) for k, v in self.redis.hgetall(handled_key(self.pool)).items()}

    def account(self, scenario: str, traffic: RpcTraffic, seconds: float, faults: int) -> Account:
        """Answered or handled counts as not lost: a request a worker handled whose answer came
        after the caller's timeout was late, not lost (the note says how many); one never handled
        is lost."""
        handled = self.handled()
        seen = {rid: max(traffic.answers[rid], handled.get(rid, 0)) for rid in traffic.ids}
        late = sum(1 for rid in traffic.ids if not traffic.answers[rid] and handled.get(rid, 0))
        failures = Counter(traffic.failures.get(rid, "?").split(":")[0] for rid in traffic.ids
                           if not seen[rid])
        lost_keys = {traffic.key(rid) for rid in traffic.ids if not seen[rid]}
        queued = self.queued([protocol.request_queue(self.pool, k) for k in lost_keys] +
                             [protocol.orphan_queue(self.pool), protocol.dl_queue(self.pool)])
        notes = [f"{traffic.resent} re-sent after a lost connection" if traffic.resent else "",
                 f"{queued} still queued at the end" if queued else "",
                 f"{late} handled, answered after the {traffic.size.timeout:g} s timeout" if late else "",
                 ", ".join(f"lost: {k} x{v}" for k, v in failures.items())]
        return Account.settle(scenario, traffic.ids, seen, seconds, faults, "; ".join(filter(None, notes)),
                              traffic.recovery())


Fault = Callable[[RpcRig, RpcTraffic], int]


def run_rpc(scenario: str, fault: Fault, size: RpcSize, workdir: Path,
            connections: Connections | None = None, plane_env: Mapping[str, str] | None = None) -> Account:
    """Traffic through a fresh pool while ``fault`` runs; the account once every call settled.
    ``plane_env``: settings of the control plane and its workers only (a service through a proxy, say)."""
    with RpcRig(workdir, connections, plane_env) as rig:
        start = time.monotonic()
        traffic = RpcTraffic(rig.pool, rig.settings, size).start()
        faults = fault(rig, traffic)
        traffic.join()
        return rig.account(scenario, traffic, time.monotonic() - start, faults)


# -- faults --------------------------------------------------------------------------------------
def kill_workers(rig: RpcRig, traffic: RpcTraffic) -> int:
    """SIGKILL half of the pool's workers (at least one), three times during the run."""
    killed = 0
    for at in (0.25, 0.5, 0.75):
        traffic.wait_progress(at)
        pids = rig.workers()
        started = time.monotonic()
        killed += kill_pids(random.sample(pids, max(1, len(pids) // 2)) if pids else [])
        traffic.fault_over(started)
    return killed


def kill_control_plane(rig: RpcRig, traffic: RpcTraffic) -> int:
    """SIGKILL ``switchyard local`` (every bridge and the reconciler at once), restart it 1 s later."""
    for at in (0.3, 0.6):
        traffic.wait_progress(at)
        started = time.monotonic()
        rig.plane.sigkill()
        time.sleep(1.0)  # pace: down for a second
        rig.plane.start()
        traffic.fault_over(started)
    return 2


def flush_state(rig: RpcRig, traffic: RpcTraffic) -> int:
    """Delete every Redis key of the pool's state, twice during the run."""
    for at in (0.3, 0.6):
        traffic.wait_progress(at)
        started = time.monotonic()
        flush_pool_state(rig.redis, rig.pool)
        traffic.fault_over(started)
    return 2


RABBITMQ4_SCRIPT = [str(ROOT / "scripts/rabbitmq4.sh")]


def restart_rabbitmq(rig: RpcRig, traffic: RpcTraffic, *how: str) -> int:
    """Restart the suite's own RabbitMQ (4.0, port 5673) in the middle of the run."""
    traffic.wait_progress(0.4)
    started = time.monotonic()
    subprocess.run([*RABBITMQ4_SCRIPT, "restart", *how], check=True, capture_output=True, timeout=180)
    traffic.fault_over(started)
    return 1


def kill_rabbitmq(rig: RpcRig, traffic: RpcTraffic) -> int:
    """SIGKILL the suite's RabbitMQ (4.0) in the middle of the run, and start it again (a crash)."""
    return restart_rabbitmq(rig, traffic, "--kill")
