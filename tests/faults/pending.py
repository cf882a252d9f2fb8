"""The pending request queue under faults: the node a polling service polls, SIGKILLed with requests taken.

``switchyard pending serve`` (the node) runs as a subprocess; a polling service (``PollingService``,
here) long-polls it, takes requests and answers each after ``WORK_S``, so it always holds some when
the node dies. Callers on another node (``PendingQueue`` here) wait for every answer. The node comes
back on the same port 1 s later; the service's answers and polls retry until it does. No call is
re-sent: a call that ends in an error is lost. Every handling is counted, so one handled twice is a
duplicate even if its caller saw one answer.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from switchyard.pending import PendingQueue, PendingSettings
from switchyard.pending.client import PollingService, ServiceRequest
from tests.conftest import unique, wait_for
from tests.delay.conftest import free_port
from tests.faults.account import Account, recovery_after
from tests.faults.procs import Service
from tests.pending.test_faults import env_for

WORK_S = 0.2
ENDPOINT = "faults"
TOKEN = "faults-token"


@dataclass(frozen=True)
class PendingSize:
    requests: int
    callers: int = 16  # calls waiting at once
    kills: tuple[float, ...] = (0.3, 0.6)  # of the calls sent


SIZES = {"full": PendingSize(requests=600), "short": PendingSize(requests=200)}


class PendingRig:
    """A private key prefix, the node as a subprocess, a polling service and a caller node here."""

    def __init__(self, workdir: Path) -> None:
        self.prefix = unique("faults-pq")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # A request the dying node popped comes back after the processor timeout: 6 s keeps the run
        # short and still leaves a live processor three heartbeats to claim what it holds.
        self.settings = replace(PendingSettings.from_env(), prefix=self.prefix, heartbeat_initial_delay_s=1.0,
                                heartbeat_interval_s=2.0, processor_timeout_s=6.0, sender_timeout_s=20.0)
        self.node = Service(["pending", "serve", "--port", str(self.port), "--threads", "64"], {
            **env_for(self.settings), "SWITCHYARD_PENDING_TOKENS": json.dumps({ENDPOINT: TOKEN}),
            "SWITCHYARD_PENDING_HTTP_POLL_WAIT_S": "5",
        }, workdir / f"pending-{self.prefix}.log", tag=self.prefix)
        self.handled: Counter[str] = Counter()
        self.holding = 0  # requests the service holds now
        self._lock = threading.Lock()
        self.service = PollingService(self.url, ENDPOINT, TOKEN, self._handle, concurrency=8,
                                      settings=self.settings)
        self.caller = PendingQueue(self.settings)

    def _handle(self, request: ServiceRequest) -> object:
        with self._lock:
            self.holding += 1
            self.handled[request.body] += 1
        time.sleep(WORK_S)  # pace: the service works WORK_S on a request
        with self._lock:
            self.holding -= 1
        return request.body

    def __enter__(self) -> PendingRig:
        self.node.start()
        self.wait_listening()
        self.caller.start()
        self.service.start()
        return self

    def wait_listening(self) -> None:
        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(listening, timeout=30, interval=0.05, what=f"the pending node on {self.port}")

    def __exit__(self, *exc: object) -> None:
        self.service.stop()
        self.caller.close()
        self.node.stop()

    def kill_with_requests_taken(self) -> tuple[float, float]:
        """SIGKILL the node while the service holds requests; start it again 1 s later."""
        return self.node.sigkill_holding(lambda: self.holding > 0, "a request taken", 1.0)


def run_pending(scenario: str, size: PendingSize, workdir: Path) -> Account:
    with PendingRig(workdir) as rig:
        ids = [f"p{n}" for n in range(size.requests)]
        answers: Counter[str] = Counter()
        failures: Counter[str] = Counter()
        calling: dict[str, float] = {}
        answered: dict[str, float] = {}
        kills: list[tuple[float, float]] = []

        def call(rid: str) -> None:
            calling[rid] = time.monotonic()
            try:
                if rig.caller.queue_and_wait(ENDPOINT, rid).body == rid:
                    answers[rid] += 1
                    answered[rid] = time.monotonic()
            except Exception as exc:
                failures[type(exc).__name__] += 1

        start = time.monotonic()
        with ThreadPoolExecutor(size.callers) as pool:
            futures = [pool.submit(call, rid) for rid in ids]
            for fraction in size.kills:
                wait_for(lambda fraction=fraction: len(calling) >= fraction * size.requests, timeout=120,
                         interval=0.01, what="calls under way")
                kills.append(rig.kill_with_requests_taken())
            for future in futures:
                future.result()
        # Answered, and how often handled; a call that ended in an error is lost, handled or not.
        seen = {rid: max(answers[rid], rig.handled[rid]) if answers[rid] else 0 for rid in ids}
        note = ", ".join(f"lost: {name} x{count}" for name, count in failures.items())
        return Account.settle(scenario, ids, seen, time.monotonic() - start, len(kills), note,
                              recovery_after(kills, calling, answered))
