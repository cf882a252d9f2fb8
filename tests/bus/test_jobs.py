"""The job queue (uniqueness, scheduling, scrubbing), a worker killed mid-delivery, autodrop under a
small max_mem on a private Redis, telemetry, the housekeeping function and ``switchyard bus``."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import threading

import requests
from redis.crc import key_slot

from switchyard.bus.housekeeping import autodrop, housekeep, telemetry
from switchyard.bus.jobs import JobQueue, heartbeat, scrub
from switchyard.bus.store import BusStore
from switchyard.cli import main as cli_main
from tests.bus.conftest import ROOT_KEY, connect_redis_url, drop_bus, fast_settings, free_port
from tests.conftest import subprocess_env, unique, wait_for


def test_a_duplicate_enqueue_is_a_no_op(store):
    q = JobQueue(store, "main")
    assert q.push("deliver:a", delay_ms=60_000) == 1
    assert q.push("deliver:a", delay_ms=60_000) == 0  # already scheduled, not sooner
    assert q.lengths().scheduled == 1
    assert q.push("deliver:a") == 2  # brought forward: instant now
    assert q.push("deliver:a") == 0
    assert (q.lengths().instant, q.lengths().scheduled) == (1, 0)
    assert q.acquire("w1", 0.1) == "deliver:a"
    assert q.push("deliver:a") == 0  # pending counts too
    assert q.lengths() == q.lengths().__class__(instant=0, scheduled=0, pending=1)
    q.retry("w1", "deliver:a", 50)  # the job asks to run later: scheduled, still unique
    assert q.push("deliver:a", delay_ms=60_000) == 0
    wait_for(lambda: q.promote_due() == 1, interval=0.02, what="the retried job due in 50 ms promoted")
    assert q.acquire("w1", 0.1) == "deliver:a"
    q.ack("w1", "deliver:a")
    assert q.push("deliver:a") == 1  # acked: a new copy may be queued


def test_scrubbing_puts_back_the_jobs_of_dead_workers_only(store):
    q = JobQueue(store, "main")
    q.push("deliver:dead")
    q.push("deliver:alive")
    heartbeat(store, ["dead", "alive"])
    assert q.acquire("dead", 0.1) == "deliver:dead"
    assert q.acquire("alive", 0.1) == "deliver:alive"
    assert scrub(store, 60_000) == (0, 0)  # both seen just now

    def scrubbed() -> tuple[int, int] | bool:
        heartbeat(store, ["alive"])
        return (got := scrub(store, 200)) != (0, 0) and got

    assert wait_for(scrubbed, interval=0.05, what="the dead worker unseen for 200 ms") == (1, 1)  # its job
    # put back, the dead worker forgotten
    assert not store.redis.hexists(store.workers_key, "dead")
    assert q.acquire("other", 0.1) == "deliver:dead"
    assert q.acquire("alive", 0.1) == "deliver:alive"  # still its own
    q.ack("other", "deliver:dead")


def test_a_worker_killed_mid_delivery_loses_nothing(bus, subscriber):
    """SIGKILL while the subscriber holds the request: the job stays pending for the dead worker,
    the scrubber puts it back, and the same batch is delivered again."""
    pub, sub = bus.client("pub"), bus.client("sub")
    assert sub.post("/subscription", json={"topics": ["orders"], "callback": subscriber.url, "uuid": "u",
                                           "max": 5, "timeout": 0}).status_code == 204
    subscriber.hold = threading.Event()
    s = bus.store.settings
    env = subprocess_env(SWITCHYARD_BUS_NAME=s.name, SWITCHYARD_BUS_ALLOW_HTTP_CALLBACKS="1",
                         SWITCHYARD_BUS_CALLBACK_ALLOW=s.callback_allow,
                         SWITCHYARD_BUS_WORKER_THREADS="1", SWITCHYARD_BUS_HEARTBEAT_MS="200",
                         SWITCHYARD_BUS_SCRUB_AFTER_MS="1000")
    proc = subprocess.Popen([sys.executable, "-m", "switchyard", "bus", "worker"], env=env,
                            stdout=subprocess.DEVNULL)
    try:
        for i in range(3):
            pub.post("/topics/orders", json={"type": "create", "url": f"https://x.example/{i}"})
        assert subscriber.arrived.wait(15), "the worker never delivered"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    subscriber.hold.set()  # the dead worker's request completes: its 204 reaches nobody
    wait_for(lambda: subscriber.deliveries, what="the first (orphaned) delivery")
    first = subscriber.deliveries[0].events
    assert len(first) == 3
    assert bus.store.queued(sub.token)[0] == 3  # not removed: the worker died before settling
    subscriber.hold = None
    # A new worker process: its scrubber finds the dead worker's job; SIGTERM stops it cleanly.
    proc = subprocess.Popen([sys.executable, "-m", "switchyard", "bus", "worker"], env=env,
                            stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(subscriber.deliveries) >= 2, timeout=20, what="the redelivery")
        assert subscriber.deliveries[1].events == first
        wait_for(lambda: bus.store.queued(sub.token)[0] == 0, what="the batch settled")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_ingest_survives_a_flushed_script_cache(private_redis):
    """Publishes go by bare EVALSHA: a Redis that lost its scripts (restarted, SCRIPT FLUSH) gets the
    script loaded again, by concurrent publishers too, instead of a NOSCRIPT error."""
    store = BusStore(connect_redis_url(private_redis), fast_settings(unique("noscript")))
    publisher = store.create_token("publisher")
    store.subscribe("reader", ["flushed"], "https://sub.example/e", "u", 100, 3_600_000)
    assert store.publish("flushed", publisher, '{"n":1}') == 1
    store.redis.script_flush()
    assert not store.redis.script_exists(store.script("ingest").sha)[0]
    event = '{"n":2}'
    threads = [threading.Thread(target=store.publish, args=("flushed", publisher, event)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.queued("reader")[0] == 9


def test_autodrop_removes_the_oldest_batches_under_a_small_max_mem(private_redis):
    client = connect_redis_url(private_redis)
    store = BusStore(client, fast_settings(unique("drop")))
    publisher = store.create_token("publisher")
    for token, n in (("old", 300), ("young", 300)):
        store.subscribe(token, [f"t_{token}"], "https://sub.example/e", "u", 50, 3_600_000)
        for i in range(n):
            store.publish(f"t_{token}", publisher, f'{{"n":{i},"pad":"{"x" * 500}"}}')
    base = int(client.info("memory")["used_memory"])
    assert autodrop(store).batches_dropped == 0  # default max_mem: far above what is used
    # High mark 70 kB under what is used now, low mark 260 kB under it: more than "old" holds
    # (300 x ~0.55 kB), so all of "old" goes, then the oldest batches of "young".
    small = BusStore(client, dataclasses.replace(store.settings, max_mem=base + 50_000, min_free=120_000))
    outcome = autodrop(small)
    assert outcome.batches_dropped > 0
    assert int(client.info("memory")["used_memory"]) < small.settings.max_mem - 2 * small.settings.min_free
    assert outcome.dropped_by_subscriber["old"] == 300  # the oldest go first
    assert store.queued("old")[0] == 0
    remaining, _ = store.queued("young")
    assert 0 < remaining < 300
    assert outcome.dropped_by_subscriber["young"] == 300 - remaining
    assert outcome.dropped_by_subscriber["young"] % 50 == 0  # whole batches of max=50
    head = client.xrange(store.stream_key("young"), count=1)
    assert head[0][1][b"e"].startswith(b'{"n":%d,' % (300 - remaining))  # what is left is the newest
    assert store.counters()["autodropped:old"] == 300
    drop_bus(store)


def test_telemetry_and_the_housekeeping_function(bus, subscriber, monkeypatch, capsys):
    pub, sub = bus.client("pub"), bus.client("metered")
    assert sub.post("/subscription", json={"topics": ["meter"], "callback": subscriber.url, "uuid": "u",
                                           "max": 2, "timeout": 3_600_000}).status_code == 204
    for i in range(5):
        pub.post("/topics/meter", json={"type": "noop", "url": f"https://x.example/{i}"})
    t = telemetry(bus.store)
    (gauge,) = t.subscribers
    assert (gauge.name, gauge.events, gauge.health_points) == ("metered", 5, 100)
    assert gauge.batches == 3  # 2 full batches (instant jobs) and one waiting
    assert t.jobs["main"]["instant"] == 1 and t.used_memory > 0
    outcome = housekeep(bus.store)
    assert outcome.subscribers == 1 and outcome.events_autodropped == 0
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    capsys.readouterr()
    telemetry(bus.store)
    emitted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    by_name = {m["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"]: m for m in emitted}
    assert by_name["BusMinSubscriberHealth"]["BusMinSubscriberHealth"] == [100.0]
    assert by_name["BusEventsQueued"]["Subscriber"] == "metered"  # a name, never the token
    assert sub.token not in json.dumps(emitted)


def test_every_key_of_a_bus_is_in_one_cluster_slot(bus, subscriber, worker):
    """Every key a script touches shares the bus's hash tag (Redis Cluster runs multi-key scripts
    only within one slot)."""
    pub, sub = bus.client("pub"), bus.client("slotted")
    assert sub.post("/subscription", json={"topics": ["slots"], "callback": subscriber.url, "uuid": "u",
                                           "timeout": 0}).status_code == 204
    pub.post("/topics/slots", json={"type": "noop", "url": "https://x.example/1"})
    wait_for(lambda: subscriber.deliveries, what="a delivery")

    def bus_keys() -> list[str]:
        found = bus.store.redis.scan_iter(match=f"*{bus.store.settings.name}*", count=1000)
        return [k.decode() for k in found]

    keys = wait_for(lambda: len(found := bus_keys()) > 8 and found, what="heartbeats and aux jobs' keys too")
    assert all(k.startswith(bus.store.prefix) for k in keys)
    assert len({key_slot(k.encode()) for k in keys}) == 1


def test_switchyard_bus_serve_and_token(store, monkeypatch, capsys):
    monkeypatch.setenv("SWITCHYARD_BUS_NAME", store.settings.name)
    assert cli_main(["bus", "token", "cli-client"]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("cli-client--")
    port = free_port()
    env = subprocess_env(SWITCHYARD_BUS_NAME=store.settings.name, SWITCHYARD_BUS_ROOT_KEY=ROOT_KEY)
    command = [sys.executable, "-m", "switchyard", "bus", "serve", "--port", str(port)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert "API on http://127.0.0.1:" in proc.stdout.readline()  # printed once listening
        base = f"http://127.0.0.1:{port}"
        assert requests.get(base + "/pulse", timeout=5).status_code == 401
        assert requests.get(base + "/pulse", auth=(token, "x"), timeout=5).status_code == 204
        assert requests.get(base + "/api_tokens", auth=(ROOT_KEY, ""), timeout=5).json() == [
            {"name": "cli-client", "token": token}]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
