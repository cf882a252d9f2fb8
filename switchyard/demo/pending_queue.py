"""The pending request queue's demo: a request crosses two nodes and Redis to a polling service."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

from switchyard.core.latency import LatencySummary
from switchyard.demo.printer import Printer


def pending_queue_part(out: Printer, calls: int = 50) -> None:
    """The pending request queue: a polling service connected to node B only, a caller on node A;
    the request goes A -> Redis -> B -> the service over HTTP long poll, and the response back."""
    from switchyard.local.http_gateway import HttpGateway
    from switchyard.pending import PendingQueue, PendingSettings, PickupTimeoutError
    from switchyard.pending.api import TokenStore, build_app
    from switchyard.pending.client import PollingService

    settings = PendingSettings.from_env()
    settings = replace(settings, prefix=f"demo{uuid.uuid4().hex[:6]}", pickup_timeout_s=1.0)
    node_a, node_b = PendingQueue(settings).start(), PendingQueue(settings).start()
    tokens = TokenStore.static({"tentacle-1": "demo-token"})
    gateway = HttpGateway(build_app(node_b, tokens), threads=16).start()
    service = PollingService(gateway.url, "tentacle-1", "demo-token", settings=settings, concurrency=2,
                             handler=lambda request: {"ran": request.body, "on": "tentacle-1"}).start()
    out.section("Pending request queue: caller on node A, polling service connected to node B")
    try:
        out.line(f"node A {node_a.node_id[:8]} (caller); node B {node_b.node_id[:8]} serves the long poll on "
                 f"{gateway.url}; the service polls node B only")
        latencies = []
        for n in range(calls):
            started = time.perf_counter()
            response = node_a.queue_and_wait("tentacle-1", f"deploy step {n}")
            latencies.append(time.perf_counter() - started)
        out.line(f"{calls} calls A -> Redis -> B -> service -> B -> Redis -> A: last answer {response.body}; "
                 f"{LatencySummary.of(latencies)}")
        try:
            node_a.queue_and_wait("tentacle-2", "nobody polls this")
        except PickupTimeoutError as exc:
            out.line(f"endpoint nobody polls -> {type(exc).__name__} after {settings.pickup_timeout_s:g} s, "
                     "request taken back")
    finally:
        node_b.close()  # first: the service's open long polls end now (204)
        service.stop()
        gateway.stop()
        node_a.close()
        for key in node_a.client.scan_iter(match=f"{settings.prefix}:*"):
            node_a.client.unlink(key)
