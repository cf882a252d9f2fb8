"""Delivery to a real HTTP subscriber on 127.0.0.1: format, batching, health points and backoff,
order under concurrent publishers, and a job that raises (the worker goes on)."""

from __future__ import annotations

import base64
import dataclasses
import threading
import time

from switchyard.bus.store import BusStore
from switchyard.bus.worker import BusWorker
from tests.conftest import wait_for


def subscribe(client, subscriber, topics, **options):
    body = {"topics": topics, "callback": subscriber.url, "uuid": f"{client.token}-uuid", **options}
    response = client.post("/subscription", json=body)
    assert response.status_code == 204, response.text


def publish(client, topic, n, start=0, **extra):
    for i in range(start, start + n):
        response = client.post(f"/topics/{topic}", json={"type": "update", "url": f"https://x.example/{i}",
                                                          "data": {"n": i}, **extra})
        assert response.status_code == 200, response.text


def test_batches_arrive_as_routemaster_sends_them(bus, subscriber, worker):
    pub, sub = bus.client("pub"), bus.client("sub")
    subscribe(sub, subscriber, ["parcels"], timeout=0)
    assert pub.post("/topics/parcels", json={"type": "create", "url": "https://x.example/p/1",
                                             "timestamp": 1234}).status_code == 200
    wait_for(lambda: subscriber.deliveries, what="a delivery")
    delivery = subscriber.deliveries[0]
    assert delivery.events == [{"topic": "parcels", "type": "create", "url": "https://x.example/p/1",
                                "t": 1234}]
    assert delivery.content_type == "application/json"  # exactly: routemaster-drain answers 415 otherwise
    expected = base64.b64encode(f"{sub.token}-uuid:x".encode()).decode()
    assert delivery.authorization == f"Basic {expected}"
    wait_for(lambda: bus.store.queued(sub.token)[0] == 0, what="the batch to leave the queue")


def test_batching_by_max_and_by_timeout(bus, make_subscriber, worker):
    pub = bus.client("pub")
    by_max, by_timeout = make_subscriber(), make_subscriber()
    full, slow = bus.client("full"), bus.client("slow")
    subscribe(full, by_max, ["ticks"], max=3, timeout=60_000)
    subscribe(slow, by_timeout, ["ticks"], max=100, timeout=400)
    started = time.monotonic()
    publish(pub, "ticks", 7)
    wait_for(lambda: len(by_max.deliveries) == 2, what="two full batches")
    assert [len(d.events) for d in by_max.deliveries] == [3, 3]
    # The subscriber saw the second batch before its 2xx reached the worker, which removes the
    # batch: wait for that, then the 7th event alone waits (for a full batch or 60 s).
    wait_for(lambda: bus.store.queued(full.token)[0] == 1, what="the two batches acknowledged")
    time.sleep(0.3)  # window: the 7th event alone is not delivered (no full batch yet)
    assert bus.store.queued(full.token)[0] == 1 and len(by_max.deliveries) == 2
    wait_for(lambda: by_timeout.deliveries, what="the timed-out batch")
    assert [e["data"]["n"] for e in by_timeout.deliveries[0].events] == list(range(7))
    assert by_timeout.deliveries[0].at - started >= 0.35
    assert by_max.ok_events() == by_timeout.deliveries[0].events[:6]


def test_failing_subscriber_loses_health_backs_off_then_recovers(bus, subscriber):
    store = bus.store
    pub, sub = bus.client("pub"), bus.client("flaky")
    subscribe(sub, subscriber, ["alerts"], timeout=0)
    failing = threading.Event()
    failing.set()
    subscriber.respond = lambda _events: 500 if failing.is_set() else 204
    quick_backoff = BusStore(store.redis, dataclasses.replace(store.settings, max_backoff_ms=2000))
    worker = BusWorker(quick_backoff, threads=1).start()
    try:
        publish(pub, "alerts", 3)
        wait_for(lambda: store.subscriber(sub.token).health_points == 0, timeout=15, what="0 health points")
        assert all(d.status == 500 for d in subscriber.deliveries)
        assert len(subscriber.deliveries) >= 50  # 100 hp, -2 per failure
        # At 0 hp the backoff is round(2000 * 2^0) = 2 s (1 s at 1 hp): attempts are spaced.
        count = len(subscriber.deliveries)
        time.sleep(1.0)  # window: no more than one attempt within the backoff
        assert len(subscriber.deliveries) - count <= 1
        until = store.subscriber(sub.token).backoff_until_ms
        assert until > store.now_ms() - 2000
        failing.clear()
        wait_for(lambda: subscriber.ok_events(), timeout=5, what="delivery after recovery")
        assert [e["data"]["n"] for e in subscriber.ok_events()] == [0, 1, 2]
        assert store.subscriber(sub.token).health_points == 1  # +1 per success
        assert store.queued(sub.token)[0] == 0
    finally:
        worker.close()


def test_order_per_subscriber_under_concurrent_publishers(bus, make_subscriber, store):
    """Batches of one subscriber are delivered in acceptance order, even with retries and several
    delivery threads. A reliable subscriber of the same topics sees the acceptance order."""
    topics = ["north", "south", "east", "west"]
    publishers = [bus.client(f"pub-{t}") for t in topics]
    flaky_sub, steady_sub = make_subscriber(), make_subscriber()
    flaky, steady = bus.client("flaky"), bus.client("steady")
    subscribe(flaky, flaky_sub, topics, max=7, timeout=0)
    subscribe(steady, steady_sub, topics, max=50, timeout=0)
    calls = {"n": 0}

    def every_third_fails(_events):
        calls["n"] += 1
        return 503 if calls["n"] % 3 == 0 else 204

    flaky_sub.respond = every_third_fails
    workers = [BusWorker(store, threads=3).start() for _ in range(2)]
    try:
        per_publisher = 60
        threads = [threading.Thread(target=publish, args=(client, topic, per_publisher))
                   for client, topic in zip(publishers, topics, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = per_publisher * len(topics)
        wait_for(lambda: len(steady_sub.ok_events()) == total, timeout=20, what="steady deliveries")
        wait_for(lambda: len(flaky_sub.ok_events()) == total, timeout=30, what="flaky deliveries")
    finally:
        for w in workers:
            w.close()
    key = [(e["topic"], e["data"]["n"]) for e in steady_sub.ok_events()]
    assert [(e["topic"], e["data"]["n"]) for e in flaky_sub.ok_events()] == key
    for topic in topics:
        assert [n for t, n in key if t == topic] == list(range(per_publisher))
    assert any(d.status == 503 for d in flaky_sub.deliveries)


def test_a_job_that_raises_is_retried_and_the_worker_goes_on(bus, make_subscriber, worker):
    """Routemaster's thread group stopped when a job raised an unexpected exception."""
    pub = bus.client("pub")
    broken_sub, good_sub = make_subscriber(), make_subscriber()
    broken, good = bus.client("broken"), bus.client("good")
    subscribe(broken, broken_sub, ["jobs"], timeout=0)
    subscribe(good, good_sub, ["jobs"], timeout=0)
    bus.store.redis.hset(bus.store.key("sub", broken.token), "max", "not a number")
    publish(pub, "jobs", 1)
    wait_for(lambda: worker.stats.take().get("job_errors"), what="the failing job")
    publish(pub, "jobs", 2, start=1)
    wait_for(lambda: len(good_sub.ok_events()) == 3, what="the good subscriber's events")
    assert broken_sub.deliveries == []
    # retried later (each new event may bring the retry forward): never lost, never delivered broken
    scheduled = bus.store.key("jobs", "scheduled", "main")
    job = f"deliver:{broken.token}"
    wait_for(lambda: bus.store.redis.zscore(scheduled, job), what="the job scheduled again")
    bus.store.redis.hset(bus.store.key("sub", broken.token), "max", "100")
    bus.store.redis.zadd(scheduled, {job: 0})
    wait_for(lambda: len(broken_sub.ok_events()) == 3, what="the repaired subscriber's events")


def test_a_published_traceparent_reaches_the_subscriber_in_the_event(bus, subscriber, worker, tmp_path,
                                                                     monkeypatch):
    """The publish's ``traceparent`` header becomes the event's field (the bus's span of that trace),
    by the resolver and by the fast path; a malformed one starts a new trace; none adds nothing."""
    from switchyard.core import tracing
    from tests.bus.test_api import _proxy_event

    log = tmp_path / "trace.jsonl"
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(log))
    given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    pub, sub = bus.client("traced-pub"), bus.client("traced-sub")
    subscribe(sub, subscriber, ["traced"], timeout=0, max=1)
    for n, traceparent in enumerate([given, None, "00-bad"]):
        headers = {"traceparent": traceparent} if traceparent else {}
        assert pub.post("/topics/traced", json={"type": "create", "url": f"https://x.example/{n}"},
                        headers=headers).status_code == 200
    fast = _proxy_event("/topics/traced", pub.token, '{"type": "create", "url": "https://x.example/3"}')
    fast["headers"]["Traceparent"] = given
    assert bus.app.fast_publish(fast) is not None
    wait_for(lambda: len(subscriber.ok_events()) == 4, what="four deliveries")
    events = sorted(subscriber.ok_events(), key=lambda e: e["url"])
    carried = [tracing.parse(e.get("traceparent")) for e in events]
    assert carried[0].trace_id == carried[3].trace_id == given.split("-")[1]
    assert carried[0].span_id != given.split("-")[2]  # the bus's own span
    assert "traceparent" not in events[1]
    assert carried[2] is not None and carried[2].trace_id != carried[0].trace_id
    wait_for(lambda: len([h for h in tracing.read_hops(carried[0].trace_id, str(log))
                          if h["event"] == "delivered"]) == 2, what="the delivered hops")
    hops = tracing.read_hops(carried[0].trace_id, str(log))
    assert [h["event"] for h in hops].count("published") == 2
    assert {h["subscriber"] for h in hops if h["event"] == "delivered"} == {"traced-sub"}
