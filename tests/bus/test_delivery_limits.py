"""One subscriber must not stall or crash the others (issue 23, item 4), measured on a real
``switchyard bus worker`` process: a callback dripping its answer, a huge answer, four dripping
subscribers beside a healthy one, many subscriptions on one slow host, a dripping port beside a
healthy port of the same host, and a worker SIGKILLed mid-delivery. Servers on 127.0.0.0/8 only."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from switchyard.bus.callbacks import parse_callback
from switchyard.bus.delivery import HostSlots
from switchyard.bus.jobs import scrub
from switchyard.bus.store import BusStore
from switchyard.bus.worker import BusWorker
from tests.bus.servers import drip, huge, no_content
from tests.conftest import subprocess_env, wait_for


@pytest.fixture
def start_worker(bus) -> Iterator[Callable[..., subprocess.Popen]]:
    """``switchyard bus worker`` processes on the test's bus, with these environment overrides."""
    procs: list[subprocess.Popen] = []

    def start(**env: str) -> subprocess.Popen:
        s = bus.store.settings
        variables = dict(SWITCHYARD_BUS_NAME=s.name, SWITCHYARD_BUS_ALLOW_HTTP_CALLBACKS="1",
                         SWITCHYARD_BUS_CALLBACK_ALLOW="127.0.0.1", SWITCHYARD_BUS_HEARTBEAT_MS="200",
                         SWITCHYARD_BUS_SCRUB_AFTER_MS="1000", SWITCHYARD_LOG_LEVEL="ERROR")
        variables.update(env)
        proc = subprocess.Popen([sys.executable, "-m", "switchyard", "bus", "worker"],
                                env=subprocess_env(**variables), stdout=subprocess.PIPE, text=True)
        assert "worker" in proc.stdout.readline()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def subscribe(bus, name: str, callback: str, topic: str):
    client = bus.client(name)
    response = client.post("/subscription", json={"topics": [topic], "callback": callback, "uuid": "u",
                                                  "timeout": 0})
    assert response.status_code == 204, response.text
    return client


def latency(pub, healthy, n: int) -> float:
    """Seconds from publishing the ``n``-th event on ``orders`` to ``healthy`` receiving it."""
    sent = time.monotonic()
    pub.post("/topics/orders", json={"type": "create", "url": f"https://x.example/{n}"})
    wait_for(lambda: len(healthy.seen) > n, timeout=15, interval=0.005, what="the healthy delivery")
    return healthy.seen[n].at - sent


def proc_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def test_a_dripping_callback_is_cut_at_the_delivery_deadline(bus, make_server, start_worker):
    """1 byte every 0.5 s for 8 s: no single read waits 2 s, only a total deadline stops it."""
    slow = make_server(answer=drip(0.5, 8.0))
    pub, sub = bus.client("pub"), subscribe(bus, "slow", slow.url(), "drips")
    start_worker(SWITCHYARD_BUS_DELIVERY_TIMEOUT_MS="2000")
    pub.post("/topics/drips", json={"type": "create", "url": "https://x.example/1"})
    wait_for(lambda: slow.seen, timeout=10, what="the delivery")
    wait_for(lambda: bus.store.subscriber(sub.token).health_points < 100, timeout=12, interval=0.02,
             what="the delivery to fail")
    held = time.monotonic() - slow.seen[0].at
    print(f"a dripping delivery held {held:.2f} s against a 2 s deadline")
    assert held < 2.8


def test_a_huge_answer_is_not_read_into_the_worker(bus, make_server, start_worker):
    """50 MB answered as fast as the worker reads it: the worker reads a few KB and hangs up."""
    small, big = make_server(), make_server(answer=huge(50 << 20))
    pub = bus.client("pub")
    small_sub = subscribe(bus, "small", small.url(), "warm")
    big_sub = subscribe(bus, "big", big.url(), "big")
    proc = start_worker()
    pub.post("/topics/warm", json={"type": "create", "url": "https://x.example/1"})
    wait_for(lambda: small.seen, what="the warm-up delivery")
    wait_for(lambda: bus.store.queued(small_sub.token)[0] == 0, what="the warm-up delivery acknowledged")
    before = proc_kib(proc.pid, "VmRSS")
    pub.post("/topics/big", json={"type": "create", "url": "https://x.example/2"})
    wait_for(lambda: big.seen, what="the big delivery")
    settled = lambda: (bus.store.queued(big_sub.token)[0] == 0  # noqa: E731
                       or bus.store.subscriber(big_sub.token).health_points < 100)
    wait_for(settled, timeout=30, interval=0.05, what="the big delivery to settle")
    peak = proc_kib(proc.pid, "VmHWM")
    print(f"worker RSS before {before / 1024:.1f} MiB, peak after a 50 MiB answer {peak / 1024:.1f} MiB "
          f"(+{(peak - before) / 1024:.1f} MiB)")
    assert peak - before < 10 * 1024


def test_four_dripping_subscribers_do_not_delay_a_healthy_one(bus, make_server, start_worker):
    """The default 4 delivery threads, each taken by a dripping subscriber on its own host."""
    wide = dataclasses.replace(bus.store.settings, callback_allow="127.0.0.0/8")  # a host per dripper
    bus.serve(BusStore(bus.store.redis, wide))
    healthy = make_server("127.0.0.1")
    drippers = [make_server(f"127.0.0.{10 + i}", answer=drip(0.5, 8.0)) for i in range(4)]
    pub = bus.client("pub")
    subscribe(bus, "healthy", healthy.url(), "orders")
    for i, d in enumerate(drippers):
        subscribe(bus, f"drip{i}", d.url(), "drips")
    start_worker(SWITCHYARD_BUS_WORKER_THREADS="4", SWITCHYARD_BUS_CALLBACK_ALLOW="127.0.0.0/8")

    alone = [latency(pub, healthy, n) for n in range(3)]
    pub.post("/topics/drips", json={"type": "create", "url": "https://x.example/d"})
    wait_for(lambda: all(d.in_flight for d in drippers), timeout=10, what="4 dripping deliveries")
    beside = [latency(pub, healthy, n) for n in range(3, 6)]
    print(f"healthy subscriber: alone {[round(x * 1000, 1) for x in alone]} ms; beside 4 dripping "
          f"{[round(x * 1000, 1) for x in beside]} ms")
    assert all(d.in_flight for d in drippers)  # still dripping while the healthy one was served
    assert max(beside) < 0.5


def test_delivery_threads_grow_to_the_cap_and_shrink_back(bus, make_server):
    """1 usual thread, at most 3: five dripping subscribers on five hosts get 3 threads between
    them, and once they are done the worker is back to 1."""
    wide = dataclasses.replace(bus.store.settings, callback_allow="127.0.0.0/8", worker_threads=1,
                               max_threads=3, delivery_timeout_s=5.0)
    store = BusStore(bus.store.redis, wide)
    bus.serve(store)
    drippers = [make_server(f"127.0.0.{20 + i}", answer=drip(0.3, 2.0)) for i in range(5)]
    pub = bus.client("pub")
    for i, d in enumerate(drippers):
        subscribe(bus, f"drip{i}", d.url(), "drips")
    worker = BusWorker(store, threads=1).start()
    try:
        pub.post("/topics/drips", json={"type": "create", "url": "https://x.example/d"})
        peak, began = 0, time.monotonic()
        while time.monotonic() - began < 2.5:
            peak = max(peak, worker.thread_count(), sum(d.in_flight for d in drippers))
            time.sleep(0.02)  # window: samples the threads while the drips run; never more than 3
        wait_for(lambda: all(d.seen for d in drippers), timeout=15, what="every dripper served")
        wait_for(lambda: worker.thread_count() == 1, timeout=10, what="the extra threads to end")
        print(f"delivery threads: at most {peak} (cap 3), then {worker.thread_count()}")
        assert peak == 3
    finally:
        worker.close()


def test_one_slow_host_holds_at_most_its_share_of_threads(bus, make_server, start_worker):
    """Six subscriptions aimed at one dripping host: at most SWITCHYARD_BUS_HOST_THREADS (2) of
    the worker's deliveries wait on it at once."""
    slow = make_server("127.0.0.1", answer=drip(0.5, 4.0))
    pub = bus.client("pub")
    for i in range(6):
        subscribe(bus, f"same{i}", slow.url(f"/cb{i}"), "drips")
    start_worker(SWITCHYARD_BUS_WORKER_THREADS="4")
    pub.post("/topics/drips", json={"type": "create", "url": "https://x.example/d"})
    wait_for(lambda: slow.seen, what="a delivery")
    time.sleep(2.0)  # window: never more than 2 deliveries in flight to the slow host
    print(f"deliveries in flight at once to one slow host: at most {slow.max_in_flight}")
    assert slow.max_in_flight <= 2


def test_one_dripping_port_does_not_hold_another_port_of_its_host(bus, make_server, start_worker):
    """Two subscribers on 127.0.0.1, on two ports, one slot per host and port: the healthy one's
    deliveries go out while the other port drips (the slot was per host name: they waited for the
    dripping delivery's end)."""
    dripping = make_server("127.0.0.1", answer=drip(0.5, 8.0))
    healthy = make_server("127.0.0.1")
    pub = bus.client("pub")
    subscribe(bus, "dripping", dripping.url(), "drips")
    subscribe(bus, "healthy", healthy.url(), "orders")
    start_worker(SWITCHYARD_BUS_WORKER_THREADS="4", SWITCHYARD_BUS_HOST_THREADS="1")
    pub.post("/topics/drips", json={"type": "create", "url": "https://x.example/d"})
    wait_for(lambda: dripping.in_flight, what="the dripping delivery")
    waits = [latency(pub, healthy, n) for n in range(3)]
    print(f"healthy port beside a dripping port of its host: {[round(w * 1000, 1) for w in waits]} ms")
    assert max(waits) < 0.5
    assert dripping.in_flight  # still dripping while the other port was served


def test_the_host_cap_takes_the_schemes_port_when_the_url_names_none():
    slots = HostSlots(1)
    first, same, other = (parse_callback(url, allow_http=False) for url in (
        "https://a.example/x", "https://a.example:443/y", "https://a.example:8443/x"))
    assert slots.take(first.host, first.port)
    assert not slots.take(same.host, same.port)  # port 443 either way: one server
    assert slots.take(other.host, other.port)


def test_a_worker_killed_mid_delivery_counts_a_failure_against_it(bus, make_server, start_worker):
    """The worker that died held the delivery: the subscriber loses health points and backs off, as
    for any failed delivery, instead of the next worker taking the job at once."""
    release = threading.Event()

    def hold(handler) -> None:
        release.wait(30)
        no_content(handler)

    server = make_server(answer=hold)
    pub, sub = bus.client("pub"), subscribe(bus, "sub", server.url(), "orders")
    store = bus.store
    store.redis.hset(store.key("sub", sub.token), "hp", 3)
    proc = start_worker(SWITCHYARD_BUS_WORKER_THREADS="1")
    pub.post("/topics/orders", json={"type": "create", "url": "https://x.example/1"})
    wait_for(lambda: server.seen, what="the delivery")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    release.set()
    # A worker has several ids (its threads'), each seen on its own: wait for the one holding the job.
    jobs, _forgotten = wait_for(lambda: (got := scrub(store, 1000))[0] and got, interval=0.05,
                                what="the dead worker unseen for SCRUB_AFTER_MS, its job put back")
    after = store.subscriber(sub.token)
    now = store.now_ms()
    print(f"scrubbed {jobs} job(s); hp 3 -> {after.health_points}, no delivery for "
          f"{max(0, after.backoff_until_ms - now)} ms")
    assert jobs == 1
    assert after.health_points == 1  # -2, as a failed delivery
    assert after.backoff_until_ms - now > 20_000  # round(60 s * 2^-1)

