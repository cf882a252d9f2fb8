"""The bus API against an outsider with a client token (issue 23, items 5-8): a revoked token's
subscription, deeply nested JSON, topics created by subscribing, credentials in logs."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator

import pytest
import requests

from switchyard.bus.housekeeping import housekeep
from switchyard.core.observability import logger as switchyard_logger
from tests.bus.conftest import ROOT_KEY
from tests.conftest import wait_for

EVENT = {"type": "create", "url": "https://api.example/widgets/1"}
DEEP = "[" * 100_000 + "]" * 100_000


# -- item 5: a revoked token's subscription ------------------------------------------------------


def test_revoking_a_token_removes_its_subscriber(bus, subscriber, worker):
    """Routemaster's rule: the subscriber goes with its token, and nothing more is delivered to it."""
    sub, publisher = bus.client("leaving"), bus.client("staying")
    assert sub.post("/subscription", json={"topics": ["orders"], "callback": subscriber.url,
                                           "uuid": "u"}).status_code == 204
    assert publisher.post("/topics/orders", json={**EVENT, "timestamp": 1}).status_code == 200
    assert wait_for(lambda: len(subscriber.ok_events()) == 1)
    assert publisher.post("/topics/orders", json={**EVENT, "timestamp": 2}).status_code == 200  # queued
    assert bus.root.delete(f"/api_tokens/{sub.token}").status_code == 204
    assert bus.store.subscriber(sub.token) is None
    assert bus.store.queued(sub.token)[0] == 0
    assert sub.token not in bus.store.subscriber_tokens()
    assert sub.token not in bus.root.get("/subscriptions").text
    for n in range(3):
        assert publisher.post("/topics/orders", json={**EVENT, "timestamp": 10 + n}).status_code == 200
    time.sleep(1.0)  # window: a worker runs; nothing reaches the revoked subscriber
    assert [d.events for d in subscriber.deliveries if any(e["t"] >= 10 for e in d.events)] == []


def test_root_has_no_subscriber_of_its_own(bus, subscriber):
    """Root's DELETE /subscriber acted on root's own key (a 404 that looked like success elsewhere):
    root removes a client's subscriber by revoking its token."""
    sub = bus.client("kept")
    assert sub.post("/subscription", json={"topics": ["t"], "callback": subscriber.url,
                                           "uuid": "u"}).status_code == 204
    assert bus.root.delete("/subscriber").status_code == 401
    assert bus.root.delete("/subscriber/topics/t").status_code == 401
    assert bus.store.subscriber(sub.token, with_topics=True).topics == ("t",)


# -- item 6: deeply nested JSON -----------------------------------------------------------------

ROUTES = [("post", "/api_tokens"), ("delete", "/api_tokens/sometoken"), ("get", "/api_tokens"),
          ("post", "/topics/deep"), ("get", "/topics"), ("delete", "/topics/deep"),
          ("post", "/subscription"), ("post", "/subscriber"), ("delete", "/subscriber"),
          ("delete", "/subscriber/topics/deep"), ("get", "/subscriptions"), ("get", "/subscribers"),
          ("get", "/pulse")]


@pytest.mark.parametrize("method,path", ROUTES)
def test_deeply_nested_json_is_refused_not_a_crash(bus, method: str, path: str):
    """A 100,000-deep JSON body was an uncaught RecursionError (502 with a traceback) on every
    route, without a token too: 401 without one, else 400 where the route reads a body."""
    anonymous = getattr(requests, method)(bus.url + path, data=DEEP, timeout=10)
    assert anonymous.status_code == 401, anonymous.text
    assert getattr(requests, method)(bus.url + path, data=DEEP, auth=("nobody", "x"),
                                     timeout=10).status_code == 401
    for who in (bus.root, bus.client("deep")):
        reply = getattr(who, method)(path, data=DEEP)
        assert reply.status_code < 500, (reply.status_code, reply.text)
        if method == "post" and reply.status_code != 401:
            assert reply.status_code == 400 and "nested" in reply.text, reply.text


def test_a_deep_body_is_not_parsed_before_authentication(bus, monkeypatch):
    """Without a valid credential the body is never read as JSON (nothing to exhaust). (A publish
    with a well-formed token is parsed before the ingest script checks that token: one round trip
    per publish; its parse is bounded, as the test above shows.)"""
    import json as json_module

    parsed: list[int] = []
    real_loads = json_module.loads
    monkeypatch.setattr(json_module, "loads",
                        lambda s, *a, **k: parsed.append(len(s)) or real_loads(s, *a, **k))
    for path, auth in (("/topics/deep", None), ("/subscription", ("nobody", "x")),
                       ("/subscriber", None), ("/api_tokens", ("nobody", "x"))):
        reply = requests.post(bus.url + path, data="[" * 50 + "]" * 50, auth=auth, timeout=10)
        assert reply.status_code == 401
    assert parsed == []


# -- item 7: topics created by subscribing ------------------------------------------------------


def _subscribe(client, subscriber, topics: list[str]) -> requests.Response:
    return client.post("/subscription", json={"topics": topics, "callback": subscriber.url, "uuid": "u"})


def test_topics_created_by_subscribing_are_bounded_per_client(bus, subscriber):
    """One client created 20,000 unclaimed topics in under a second, and GET /topics grew for
    everyone. At most SWITCHYARD_BUS_MAX_UNCLAIMED_TOPICS (100) per client."""
    limit = bus.store.settings.max_unclaimed_topics
    greedy, other = bus.client("greedy"), bus.client("other")
    many = [f"t_{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(limit + 1)]
    refused = _subscribe(greedy, subscriber, many)
    assert refused.status_code == 403 and str(limit) in refused.text
    assert bus.store.topics() == []  # all or nothing
    assert _subscribe(greedy, subscriber, many[:limit]).status_code == 204
    # the list can change, but the unclaimed topics it created still count until they go
    assert _subscribe(greedy, subscriber, ["fresh"]).status_code == 403
    assert _subscribe(greedy, subscriber, many[:3]).status_code == 204  # existing topics: free
    assert _subscribe(other, subscriber, ["fresh"]).status_code == 204  # another client's own bound
    assert len(other.get("/topics").json()) == limit + 1
    # a topic its publisher claims no longer counts against the subscriber that created it
    assert bus.client("pub").post(f"/topics/{many[0]}", json=EVENT).status_code == 200
    assert _subscribe(greedy, subscriber, ["fresh", "fresher"]).status_code == 204


def test_a_client_may_delete_the_unclaimed_topics_it_created(bus, subscriber):
    creator, stranger = bus.client("creator"), bus.client("stranger")
    assert _subscribe(creator, subscriber, ["mine"]).status_code == 204
    assert stranger.delete("/topics/mine").status_code == 403
    assert _subscribe(creator, subscriber, []).status_code == 204
    assert creator.delete("/topics/mine").status_code == 204
    assert [t["name"] for t in creator.get("/topics").json()] == []


def past_ttl(store, ttl_ms: int = 300) -> None:
    """Until the store's clock (Redis TIME: what housekeeping compares) is ``ttl_ms`` past now, so a
    topic stamped before the call is old enough (the local clock is not the one that counts)."""
    until = store.now_ms() + ttl_ms + 100
    wait_for(lambda: store.now_ms() >= until, interval=0.05, what=f"{ttl_ms} ms on the store's clock")


def test_unclaimed_topics_without_subscribers_are_cleaned_up(make_store, subscriber):
    """Housekeeping (autodrop's pass) removes unclaimed topics nobody subscribes to once they are
    SWITCHYARD_BUS_UNCLAIMED_TOPIC_TTL_MS old; subscribed or claimed topics stay."""
    store = make_store(unclaimed_topic_ttl_ms=300)
    a, b = store.create_token("a"), store.create_token("b")
    store.subscribe(a, ["left", "kept", "claimed"], subscriber.url, "u", None, None)
    store.publish("claimed", b, '{"t":1}')
    store.subscribe(a, ["kept"], subscriber.url, "u", None, None)  # "left" and "claimed" lose it
    housekeep(store)
    assert {t["name"] for t in store.topics()} == {"left", "kept", "claimed"}  # too young
    store.redis.hset(store.topics_key, "legacy", "")  # an unclaimed topic from before the bound
    past_ttl(store)
    housekeep(store)
    assert {t["name"] for t in store.topics()} == {"kept", "claimed", "legacy"}  # legacy: seen now
    past_ttl(store)
    outcome = housekeep(store)
    assert {t["name"] for t in store.topics()} == {"kept", "claimed"}
    assert outcome.topics_dropped == 1
    store.subscribe(a, ["again"], subscriber.url, "u", None, None)  # its count went down with them
    assert store.unclaimed_created(a) == 2


# -- item 8: credentials in logs ----------------------------------------------------------------


@pytest.fixture
def debug_logs() -> Iterator[io.StringIO]:
    """What the package's log handler writes, at DEBUG, for the test's duration."""
    level, handlers = switchyard_logger.log_level, logging.getLogger("switchyard").handlers
    written = io.StringIO()
    streams = [handler.setStream(written) for handler in handlers]
    switchyard_logger.setLevel(logging.DEBUG)
    yield written
    switchyard_logger.setLevel(level)
    for handler, stream in zip(handlers, streams, strict=True):
        handler.setStream(stream)


def test_credentials_never_reach_a_log_line(bus, subscriber, debug_logs):
    """At DEBUG the gateway logged ``DELETE /api_tokens/<token> -> 204``: every log line, at every
    level, has its credentials redacted (tokens, the root key, Basic/Bearer values, URL userinfo)."""
    client = bus.client("logged")
    chosen = bus.root.post("/api_tokens", json={"name": "chosen", "token": "chosen-secret-token"}).json()
    assert _subscribe(client, subscriber, ["logged"]).status_code == 204
    client.post("/topics/logged", json=EVENT)
    bus.root.delete(f"/api_tokens/{chosen['token']}")
    bus.root.delete(f"/api_tokens/{client.token}")
    switchyard_logger.error("a message naming a callback https://user:hunter2@example.com/cb and "
                            "Authorization: Bearer abc.def.ghi and Basic dXNlcjpwYXNz")
    switchyard_logger.warning("token in extra", extra={"url": f"/api_tokens/{client.token}"})
    logs = debug_logs.getvalue()
    assert "/api_tokens/" in logs  # the lines are there ...
    for secret in (client.token, "chosen-secret-token", ROOT_KEY, "hunter2", "abc.def.ghi", "dXNlcjpwYXNz"):
        assert secret not in logs, secret  # ... without the credentials


def test_a_token_revoked_before_its_subscription_is_stored_leaves_no_subscriber(store, subscriber):
    """The API checks the token, then the subscribe script runs: a revocation between the two must
    not leave a subscriber behind (the script checks the token in the same step)."""
    from switchyard.bus.errors import UnknownTokenError

    with pytest.raises(UnknownTokenError):
        store.subscribe("revoked-meanwhile", ["t"], subscriber.url, "u", None, None, registered=True)
    assert store.subscriber("revoked-meanwhile") is None and store.topics() == []


def test_revoking_again_removes_a_subscriber_left_by_an_earlier_revocation(bus, subscriber):
    """Before this version a revoked token kept its subscription: root revokes the token again (root
    sees every subscriber's token in GET /subscriptions) and the subscriber goes."""
    bus.store.subscribe("revoked-long-ago", ["old"], subscriber.url, "u", None, None)  # no token left
    assert "revoked-long-ago" in bus.root.get("/subscriptions").text
    assert bus.root.delete("/api_tokens/revoked-long-ago").status_code == 204
    assert bus.store.subscriber("revoked-long-ago") is None


def test_redis_down_is_a_503_before_parsing_too(make_store):
    """The credential check that now comes before a POST's body is parsed answers a Redis outage as
    the resolver does (503), not with a traceback."""
    from switchyard.bus.api import build_app
    from switchyard.bus.store import BusStore
    from switchyard.local.http_gateway import HttpGateway
    from tests.bus.conftest import connect_redis_url, fast_settings, free_port

    dead = BusStore(connect_redis_url(f"redis://127.0.0.1:{free_port()}/0"), fast_settings("nowhere"))
    with HttpGateway(build_app(dead), threads=4) as gw:
        for path in ("/subscription", "/topics/t", "/api_tokens"):
            reply = requests.post(gw.url + path, json={"x": 1}, auth=("someone", "x"), timeout=30)
            assert (reply.status_code, reply.text) == (503, "storage unavailable"), path
