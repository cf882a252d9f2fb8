"""The event bus under faults: ``switchyard bus worker`` SIGKILLed while it delivers.

Events are published through the API (served in this process) to one topic with two subscribers,
real HTTP servers on 127.0.0.1 that take 50 ms per batch, so the worker always holds batches when it
is killed. A batch the killed worker held comes back once its worker ids go unseen (the scrub), so
its events may arrive twice: nothing may be lost, and every duplicate must belong to a batch that was
in flight at a kill (it reached a subscriber within ``IN_FLIGHT_S`` before the kill).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import requests

from switchyard.bus.api import build_app
from switchyard.bus.store import BusStore
from switchyard.core.config import Connections
from switchyard.core.redis_client import connect_redis
from switchyard.local.http_gateway import HttpGateway
from tests.bus.conftest import ROOT_KEY, Client, Subscriber, drop_bus, fast_settings
from tests.conftest import unique, wait_for
from tests.faults.account import Account, recovery_after
from tests.faults.procs import Service

BATCH_S = 0.05  # each subscriber's time per batch
# A batch that reached a subscriber this soon before a kill may have been held by the killed worker:
# its 50 ms at the subscriber, then the worker's acknowledgement, with room for a busy machine.
IN_FLIGHT_S = 0.3
MAX_BATCH = 50


@dataclass(frozen=True)
class BusSize:
    events: int
    rate: float  # events per second
    kills: tuple[float, ...] = (0.3, 0.6)  # of the events published


SIZES = {"full": BusSize(events=3000, rate=200), "short": BusSize(events=600, rate=150)}


class BusRig:
    """A bus of its own: the API here, a worker subprocess, two subscribers that log each arrival;
    on SWITCHYARD_REDIS_URL, or on ``connections``' Redis (a private cluster)."""

    def __init__(self, workdir: Path, connections: Connections | None = None) -> None:
        settings = fast_settings(unique("faults-bus").lower())
        connections = connections or Connections.from_env()
        self.store = BusStore(connect_redis(connections), settings)
        self.worker = Service(["bus", "worker", "--threads", "4"], {
            "SWITCHYARD_REDIS_URL": connections.redis_url,
            "SWITCHYARD_REDIS_CLUSTER": "1" if connections.redis_cluster else "0",
            "SWITCHYARD_BUS_NAME": settings.name, "SWITCHYARD_BUS_ALLOW_HTTP_CALLBACKS": "1",
            "SWITCHYARD_BUS_CALLBACK_ALLOW": "127.0.0.1",  # the subscribers' (loopback) host
            "SWITCHYARD_BUS_HEARTBEAT_MS": str(settings.heartbeat_ms),
            "SWITCHYARD_BUS_SCRUB_AFTER_MS": str(settings.scrub_after_ms),
            "SWITCHYARD_BUS_SCRUB_INTERVAL_MS": str(settings.scrub_interval_ms),
            "SWITCHYARD_BUS_DELIVERY_TIMEOUT_MS": "5000",
        }, workdir / f"bus-{settings.name}.log", tag=settings.name)
        self.subscribers = [Subscriber(), Subscriber()]
        self.arrivals: list[tuple[float, str]] = []  # (time.monotonic(), "subscriber:event")
        self.busy = 0  # batches a subscriber is handling now
        self._lock = threading.Lock()
        for index, subscriber in enumerate(self.subscribers):
            subscriber.respond = lambda events, index=index: self._arrived(index, events)
        self.gateway: HttpGateway | None = None

    def _arrived(self, index: int, events: list[dict[str, Any]]) -> int:
        now = time.monotonic()
        with self._lock:
            self.busy += 1
            self.arrivals.extend((now, f"s{index}:{e['data']['n']}") for e in events)
        time.sleep(BATCH_S)  # pace: the subscriber takes BATCH_S over a batch
        with self._lock:
            self.busy -= 1
        return 204

    def __enter__(self) -> BusRig:
        # The API's metrics in this process: not on the suite's output, and not for the tests after
        # it either (an environment left changed turned off every later test's shipped metrics).
        self._quiet = mock.patch.dict(os.environ, {"POWERTOOLS_METRICS_DISABLED": "true"})
        self._quiet.start()
        self.gateway = HttpGateway(build_app(self.store), threads=8).start()
        root = Client(self.gateway.url, ROOT_KEY)
        for index, subscriber in enumerate(self.subscribers):
            token = root.post("/api_tokens", json={"name": f"sub{index}"}).json()["token"]
            response = Client(self.gateway.url, token).post("/subscription", json={
                "topics": ["parcels"], "callback": subscriber.url, "uuid": f"u{index}", "max": MAX_BATCH,
                "timeout": 100})
            assert response.status_code == 204, response.text
        token = root.post("/api_tokens", json={"name": "pub"}).json()["token"]
        self.publisher = Client(self.gateway.url, token)
        self.worker.start()
        # Its first heartbeat seen: a worker that meets a Redis fault before it (still starting
        # Python when the scenario's first fault comes on a busy machine) exits 1.
        wait_for(lambda: self.store.redis.hlen(self.store.workers_key) > 0, timeout=60, interval=0.05,
                 what="the bus worker's first heartbeat")
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        if self.gateway is not None:
            self.gateway.stop()
        for subscriber in self.subscribers:
            subscriber.close()
        drop_bus(self.store)
        self._quiet.stop()

    def post_event(self, n: int) -> requests.Response:
        return self.publisher.post("/topics/parcels", json={"type": "update", "url": f"https://x.example/{n}",
                                                             "data": {"n": n}})

    def publish(self, n: int) -> None:
        response = self.post_event(n)
        assert response.status_code == 200, response.text

    def expected(self, events: int) -> set[str]:
        """Every arrival due: each event at each subscriber (``s<subscriber>:<event>``)."""
        return {f"s{i}:{n}" for i in range(len(self.subscribers)) for n in range(events)}

    def wait_arrivals(self, expected: set[str], timeout: float = 90) -> tuple[Counter[str], dict[str, float]]:
        """Wait until everything ``expected`` arrived (or ``timeout``), then a second for late
        duplicates; how often each arrived, and when first."""
        wait_for(lambda: expected <= {key for _, key in self.arrivals}, timeout, interval=0.2, required=False)
        time.sleep(1.0)  # window: late duplicates arrive in it (counted, not wanted)
        arrived: dict[str, float] = {}
        for at, key in self.arrivals:
            arrived.setdefault(key, at)
        return Counter(key for _, key in self.arrivals), arrived

    def kill_mid_delivery(self) -> tuple[float, float]:
        """SIGKILL the worker while a subscriber handles one of its batches; start it again."""
        return self.worker.sigkill_holding(lambda: self.busy > 0, "a batch in delivery", 0.5)


def run_bus(scenario: str, size: BusSize, workdir: Path) -> Account:
    """Publish ``size.events`` while the worker is killed; the account once all arrived (or 90 s)."""
    with BusRig(workdir) as rig:
        start = time.monotonic()
        kills: list[tuple[float, float]] = []
        published: dict[int, float] = {}
        kill_at = [int(f * size.events) for f in size.kills]
        for n in range(size.events):
            time.sleep(max(0.0, start + n / size.rate - time.monotonic()))  # pace: size.rate a second
            rig.publish(n)
            published[n] = time.monotonic()
            if n in kill_at:
                kills.append(rig.kill_mid_delivery())
        expected = rig.expected(size.events)
        seen, arrived = rig.wait_arrivals(expected)
        sent_at = {key: published[int(key.partition(":")[2])] for key in expected}
        in_flight = {key for at, key in rig.arrivals if any(k - IN_FLIGHT_S <= at <= k for k, _ in kills)}
        stray = {key for key, count in seen.items() if count > 1} - in_flight
        assert not stray, f"{len(stray)} duplicates were not in flight at a kill, e.g. {sorted(stray)[:5]}"
        note = f"duplicates all in the {len(in_flight)} events in flight at the kills"
        return Account.settle(scenario, sorted(expected), seen, time.monotonic() - start, len(kills), note,
                              recovery_after(kills, sent_at, arrived))
