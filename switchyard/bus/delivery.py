"""Delivery of one subscriber's next batch over HTTP, as Routemaster does it, in order.

``POST <callback>`` with ``Content-Type: application/json`` (routemaster-drain answers 415 to
anything else), a JSON array of ``{topic, type, url, t, data?}``, Basic auth with the subscriber's
``uuid`` and password ``x``; any 2xx is success. One ``requests.Session`` per delivery thread keeps
connections to subscribers alive between batches; connect timeout 2 s, total 20 s by default.

The batch is the head of the subscriber's stream and leaves it only after the 2xx, in the same
script that releases the job (``finish_delivery.lua``): a worker killed mid-delivery leaves the job
pending, the scrubber puts it back, and the same batch is delivered again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import requests
from requests.adapters import HTTPAdapter

from switchyard.bus.store import DELIVER, BusStore, as_text
from switchyard.observability import logger

USER_AGENT = "switchyard-bus"


@dataclass(frozen=True)
class DeliveryResult:
    """What one delivery job did."""

    outcome: str  # "ok" | "fail" | "wait" (backing off) | "gone" (no subscriber) | "empty"
    events: int = 0
    health_points: int = -1
    elapsed_ms: float = 0.0
    error: str = ""


def http_session(pool_size: int = 4) -> requests.Session:
    """A session that keeps connections alive (per callback host) and never retries by itself:
    a failed POST is a failed delivery, retried by the job queue after the backoff."""
    session = requests.Session()
    adapter = HTTPAdapter(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers.update({"User-Agent": USER_AGENT, "Content-Type": "application/json"})
    return session


class Deliverer:
    """Runs ``deliver:<token>`` jobs for one worker thread."""

    def __init__(self, store: BusStore, session: requests.Session | None = None) -> None:
        self.store = store
        self.settings = store.settings
        self.session = session or http_session()

    def _finish(self, pending_key: str, job: str, outcome: str, last_id: str = "") -> int:
        s = self.settings
        return int(self.store.script("finish_delivery")(
            keys=[pending_key],
            args=[self.store.prefix, job, outcome, last_id, s.heal_rate, s.damage_rate, s.max_backoff_ms]))

    def run(self, job: str, pending_key: str) -> DeliveryResult:
        """Deliver the subscriber's next batch (at most ``max`` events, oldest first) and settle the job."""
        token = job.removeprefix(DELIVER)
        begun = self.store.script("begin_delivery")(keys=[self.store.key("sub", token),
                                                          self.store.stream_key(token)])
        if begun is None:
            self._finish(pending_key, job, "gone")
            return DeliveryResult("gone")
        callback, uuid, health, backoff_until, now, entries = begun
        if int(health) < 100 and int(backoff_until) > int(now):
            hp = self._finish(pending_key, job, "wait")
            return DeliveryResult("wait", health_points=hp)
        if not entries:
            hp = self._finish(pending_key, job, "ok")
            return DeliveryResult("empty", health_points=hp)
        body = b"[" + b",".join(fields[1] for _, fields in entries) + b"]"
        started = time.perf_counter()
        error = ""
        try:
            timeouts = (self.settings.connect_timeout_s, self.settings.delivery_timeout_s)
            response = self.session.post(as_text(callback), data=body, auth=(as_text(uuid), "x"),
                                         timeout=timeouts)
            response.close()
            if not 200 <= response.status_code < 300:
                error = f"HTTP {response.status_code}"
        except requests.RequestException as exc:
            error = f"{type(exc).__name__}: {exc}"
        elapsed_ms = (time.perf_counter() - started) * 1000
        if error:
            hp = self._finish(pending_key, job, "fail")
            logger.warning("bus delivery failed", extra={"subscriber": self.store.token_name(token),
                                                         "events": len(entries), "error": error, "hp": hp})
            return DeliveryResult("fail", len(entries), hp, elapsed_ms, error)
        hp = self._finish(pending_key, job, "ok", as_text(entries[-1][0]))
        return DeliveryResult("ok", len(entries), hp, elapsed_ms)
