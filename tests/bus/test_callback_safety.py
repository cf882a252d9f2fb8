"""A subscriber's callback must not reach inside (issue 23, items 1-3), through the bus itself: the API
and a worker, real HTTP servers on loopback addresses. The tests' allowlist admits 127.0.0.1 only
(conftest), so 127.0.0.2 and ::1 stand for the internal hosts: nothing here leaves the machine."""

from __future__ import annotations

import dataclasses
import time

import pytest

from switchyard.bus.store import BusStore
from tests.bus.servers import redirect
from tests.conftest import wait_for

INTERNAL_CALLBACKS = [
    "https://127.0.0.2/cb", "https://127.1/cb", "https://2130706433/cb", "https://0x7f000002/cb",
    "https://[::1]/cb", "https://169.254.169.254/latest/meta-data/", "https://169.254.170.2/v2/credentials",
    "https://10.0.0.5/cb", "https://172.16.3.4/cb", "https://192.168.1.10/cb", "https://100.64.0.1/cb",
    "https://[fd00::1]/cb", "https://[fe80::1]/cb", "https://0.0.0.0/cb", "https://[::]/cb",
    "https://[::ffff:127.0.0.2]/cb", "https://[::ffff:169.254.169.254]/cb", "https://[64:ff9b::a9fe:a9fe]/cb",
    "https://224.0.0.1/cb", "https://255.255.255.255/cb", "https://localhost/cb", "https://x.localhost/cb",
]


def subscribe(client, callback: str, topic: str = "parcels"):
    return client.post("/subscription", json={"topics": [topic], "callback": callback, "uuid": "u",
                                              "timeout": 0})


def failed_once(bus, token: str) -> bool:
    sub = bus.store.subscriber(token)
    return sub is not None and sub.health_points < 100


@pytest.mark.parametrize("callback", INTERNAL_CALLBACKS)
def test_a_callback_to_an_internal_address_is_refused_at_subscribe(bus, callback):
    """With no allowlist (production's default): even 127.0.0.1, which the tests' own allows."""
    bus.serve(BusStore(bus.store.redis, dataclasses.replace(bus.store.settings, callback_allow="")))
    client = bus.client("sub")
    response = subscribe(client, callback)
    print(callback, "->", response.status_code, response.text[:160])
    assert response.status_code == 400, response.text
    assert "internal" in response.text or "loopback" in response.text


def test_a_stored_callback_now_internal_is_refused_at_delivery(bus, worker, make_server):
    """What a name re-pointed at an internal address after subscribing looks like to the worker:
    the address is checked when it connects, nothing reaches the host, and it is a failed delivery."""
    allowed, internal = make_server("127.0.0.1"), make_server("127.0.0.2")
    pub, sub = bus.client("pub"), bus.client("sub")
    assert subscribe(sub, allowed.url()).status_code == 204
    bus.store.redis.hset(bus.store.key("sub", sub.token), "callback", internal.url())
    pub.post("/topics/parcels", json={"type": "create", "url": "https://x.example/1"})
    wait_for(lambda: failed_once(bus, sub.token) or internal.seen, timeout=5, what="the delivery attempt")
    hp = bus.store.subscriber(sub.token).health_points
    print("internal host saw", len(internal.seen), "request(s); hp", hp)
    assert internal.seen == []
    assert hp < 100  # failed deliveries (retried at once at first: round(60 s * 2^-hp) is 0 ms)
    assert bus.store.queued(sub.token)[0] == 1  # kept for a later attempt, not lost


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("target_host", ["127.0.0.1", "127.0.0.2"])
def test_a_redirect_is_a_failed_delivery_and_is_not_followed(bus, worker, make_server, code, target_host):
    """Even to an allowed host: a redirect would let a subscriber aim the worker anywhere, and its
    health points would tell whether the target answered 2xx."""
    target = make_server(target_host)
    callback = make_server("127.0.0.1", answer=redirect(code, target.url("/internal")))
    pub, sub = bus.client("pub"), bus.client("sub")
    assert subscribe(sub, callback.url()).status_code == 204
    pub.post("/topics/parcels", json={"type": "create", "url": "https://x.example/1"})
    wait_for(lambda: callback.seen, timeout=5, what="the delivery")
    time.sleep(0.5)  # window: a followed redirect would be under way by now
    hp = bus.store.subscriber(sub.token).health_points
    print(code, "->", target_host, ": target saw", [(s.method, s.path) for s in target.seen], "hp", hp)
    assert target.seen == []
    assert hp < 100  # counted as a failure
    assert bus.store.queued(sub.token)[0] == 1


def test_the_backslash_form_cannot_aim_at_another_host(bus, worker, make_server):
    r"""``http://A:Q\@B:P/cb``: Python's urlsplit sees host B, urllib3 connects to A. The URL is refused,
    and whatever the API thinks, the worker never connects to A."""
    other, checked = make_server("127.0.0.2"), make_server("127.0.0.1")
    pub, sub = bus.client("pub"), bus.client("sub")
    callback = f"http://127.0.0.2:{other.port}\\@127.0.0.1:{checked.port}/cb"
    response = subscribe(sub, callback)
    print(callback, "->", response.status_code, response.text[:160])
    if response.status_code == 204:
        pub.post("/topics/parcels", json={"type": "create", "url": "https://x.example/1"})
        wait_for(lambda: other.seen or checked.seen or failed_once(bus, sub.token), timeout=5,
                 what="the delivery attempt")
    print("127.0.0.2 saw", len(other.seen), "request(s); 127.0.0.1 saw", len(checked.seen))
    assert other.seen == []
    assert response.status_code == 400
