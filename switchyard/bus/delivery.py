"""Delivery of one subscriber's next batch over HTTP, as Routemaster does it, in order.

``POST <callback>`` with ``Content-Type: application/json`` (routemaster-drain answers 415 to
anything else), a JSON array of ``{topic, type, url, t, data?}``, Basic auth with the subscriber's
``uuid`` and password ``x``; any 2xx is success, anything else (a redirect too: it is never
followed) a failure. The request goes through ``callback_http.CallbackClient``: only to addresses
``callbacks`` allows, within one wall-clock deadline (``SWITCHYARD_BUS_DELIVERY_TIMEOUT_MS``),
reading at most ``SWITCHYARD_BUS_MAX_RESPONSE_BYTES`` of the answer. One client per delivery
thread keeps connections to subscribers alive between batches.

The batch is the head of the subscriber's stream and leaves it only after the 2xx, in the same
script that releases the job (``finish_delivery.lua``): a worker killed mid-delivery leaves the job
pending, and the scrubber puts it back as a failed delivery (health points, backoff) of the same
batch.
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from dataclasses import dataclass

from urllib3.exceptions import HTTPError

from switchyard.bus.callback_http import CallbackClient
from switchyard.bus.callbacks import AddressPolicy, parse_callback
from switchyard.bus.errors import CallbackError
from switchyard.bus.ports import BusStorePort
from switchyard.bus.settings import BusSettings
from switchyard.bus.store import DELIVER
from switchyard.core import tracing
from switchyard.core.observability import logger

_TRACEPARENT_FIELD = re.compile(rb'"traceparent":"([0-9a-f-]{55})"')  # as event_json writes it
HOST_BUSY_RETRY_MS = 200  # a delivery whose host is at its limit tries again this much later
OUTCOMES = ("ok", "fail", "wait", "gone", "empty", "busy")  # a DeliveryResult's, each a worker counter

@dataclass(frozen=True)
class DeliveryResult:
    """What one delivery job did."""

    # "ok" | "fail" | "wait" (backing off) | "gone" (no subscriber) | "empty" | "busy" (its host is at
    # its limit: the job is left pending, for the caller to retry in HOST_BUSY_RETRY_MS)
    outcome: str
    events: int = 0
    health_points: int = -1
    elapsed_ms: float = 0.0
    error: str = ""


def callback_client(settings: BusSettings, policy: AddressPolicy | None = None) -> CallbackClient:
    """A delivery thread's client with the bus's limits; ``policy`` replaces the allowlist and the
    system resolver (tests resolve names themselves, never through real DNS)."""
    s = settings
    return CallbackClient(policy or AddressPolicy(s.allowlist), connect_timeout_s=s.connect_timeout_s,
                          deadline_s=s.delivery_timeout_s, max_response_bytes=s.max_response_bytes)


class Deliverer:
    """Runs ``deliver:<token>`` jobs for one worker thread."""

    def __init__(self, store: BusStorePort, client: CallbackClient | None = None,
                 hosts: HostSlots | None = None) -> None:
        self.store = store
        self.settings = store.settings
        self.client = client or callback_client(store.settings)
        self.hosts = hosts or HostSlots(store.settings.host_threads)

    def run(self, job: str, pending_key: str) -> DeliveryResult:
        """Deliver the subscriber's next batch (at most ``max`` events, oldest first) and settle the job."""
        token = job.removeprefix(DELIVER)
        finish = self.store.finish_delivery
        batch = self.store.begin_delivery(token)
        if batch is None:
            finish(pending_key, job, "gone")
            return DeliveryResult("gone")
        entries = batch.entries
        if batch.health_points < 100 and batch.backoff_until_ms > batch.now_ms:
            hp = finish(pending_key, job, "wait")
            return DeliveryResult("wait", health_points=hp)
        if not entries:
            hp = finish(pending_key, job, "ok")
            return DeliveryResult("empty", health_points=hp)
        body = b"[" + b",".join(event for _, event in entries) + b"]"
        started = time.perf_counter()
        error = ""
        try:
            target = parse_callback(batch.callback, allow_http=self.settings.allow_http_callbacks)
        except CallbackError as exc:
            target, error = None, f"{type(exc).__name__}: {exc}"
        if target is not None:
            if not self.hosts.take(target.host, target.port):
                return DeliveryResult("busy", len(entries))  # not settled: the worker retries the job
            try:
                status = self.client.post(target, body, batch.uuid)
                if not 200 <= status < 300:
                    error = f"HTTP {status}"
            except (CallbackError, HTTPError, OSError, http.client.HTTPException) as exc:
                error = f"{type(exc).__name__}: {exc}"
            finally:
                self.hosts.give(target.host, target.port)
        elapsed_ms = (time.perf_counter() - started) * 1000
        if error:
            hp = finish(pending_key, job, "fail")
            logger.warning("bus delivery failed", extra={"subscriber": self.store.token_name(token),
                                                         "events": len(entries), "error": error, "hp": hp})
            return DeliveryResult("fail", len(entries), hp, elapsed_ms, error)
        hp = finish(pending_key, job, "ok", entries[-1][0])
        if tracing.trace_log_path() is not None:  # the local trace log's hops (``switchyard trace``)
            for _, event in entries:
                if (found := _TRACEPARENT_FIELD.search(event)) is not None:
                    tracing.hop(tracing.parse(found[1]), "bus", "delivered", duration_ms=elapsed_ms,
                                subscriber=self.store.token_name(token))
        return DeliveryResult("ok", len(entries), hp, elapsed_ms)


class HostSlots:
    """Deliveries in flight per callback host and port (the scheme's default port when the URL has
    none), shared by one worker's threads: past ``limit`` a delivery waits (its job retried shortly,
    not counted as a failure), so subscriptions aimed at one slow server hold at most ``limit``
    threads, however many there are, and a server on another port of the same host is not held
    behind it (counted by host name, one dripping port had kept every other port of its host waiting)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._in_flight: dict[tuple[str, int], int] = {}

    def take(self, host: str, port: int) -> bool:
        with self._lock:
            if self._in_flight.get((host, port), 0) >= self.limit:
                return False
            self._in_flight[host, port] = self._in_flight.get((host, port), 0) + 1
            return True

    def give(self, host: str, port: int) -> None:
        with self._lock:
            left = self._in_flight.get((host, port), 1) - 1
            if left:
                self._in_flight[host, port] = left
            else:
                self._in_flight.pop((host, port), None)
