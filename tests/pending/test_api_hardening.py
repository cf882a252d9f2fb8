"""The node API against an outsider (issue 23, items 6, 9, 10 and the foreign take): deeply nested
JSON, one endpoint's polls starving the others, endpoint names that could be enumerated, and a take
that is not the caller's."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from switchyard.local.http_gateway import HttpGateway
from switchyard.pending import PendingQueue
from switchyard.pending.api import TokenStore, build_app
from tests.conftest import wait_for
from tests.pending.conftest import NodeFactory
from tests.pending.test_api import AUTH, TOKENS

OTHER = {"Authorization": f"Bearer {TOKENS['other']}"}
DEEP = "[" * 100_000 + "]" * 100_000
REQUEST = "r" * 32
Served = tuple[PendingQueue, HttpGateway]


@pytest.fixture
def served(make_node: NodeFactory) -> Iterator[tuple[PendingQueue, HttpGateway]]:
    """A node whose long polls may wait 5 s, behind a gateway of 48 threads."""
    node = make_node(http_poll_wait_s=5.0)
    with HttpGateway(build_app(node, TokenStore.static(TOKENS)), threads=48) as gateway:
        yield node, gateway


@pytest.mark.parametrize("route", ["heartbeat", "response"])
def test_deeply_nested_json_is_a_400_not_a_crash(served: Served, route: str) -> None:
    """An uncaught RecursionError was a 502 with a traceback (on AWS: a function error anyone with
    a token could cause). Without a token the body is not read: 401."""
    url = f"{served[1].url}/endpoints/svc/requests/{REQUEST}/{route}"
    deep = DEEP if route == "response" else "[" * 2000 + "]" * 2000  # a heartbeat's limit is 4 KB
    assert requests.post(url, data=deep, timeout=10).status_code == 401
    reply = requests.post(url, data=deep, headers=AUTH, timeout=10)
    assert reply.status_code == 400, reply.text
    assert "nested" in reply.json()["message"]


def test_one_endpoint_cannot_starve_another_or_health(served: Served) -> None:
    """520 idle polls with one endpoint's token blocked another endpoint's poll and /health for over
    8 s. At most SWITCHYARD_PENDING_MAX_POLLS (32) polls of one endpoint wait at once: the next get
    429 at once (with Retry-After), and the other endpoints and /health are answered."""
    node, gateway = served
    started = threading.Barrier(61)
    statuses: list[tuple[int, float]] = []

    def idle_poll() -> None:
        started.wait()
        t0 = time.monotonic()
        reply = requests.get(f"{gateway.url}/endpoints/svc/next", params={"wait": 4}, headers=AUTH,
                             timeout=30)
        statuses.append((reply.status_code, time.monotonic() - t0))
        if reply.status_code == 429:
            assert int(reply.headers["Retry-After"]) >= 1

    with ThreadPoolExecutor(60) as pool:
        polls = [pool.submit(idle_poll) for _ in range(60)]
        started.wait()
        cap = node.settings.max_polls_per_endpoint
        wait_for(lambda: sum(status == 429 for status, _ in statuses) >= 60 - cap, interval=0.02,
                 what="the polls over the endpoint's cap refused, the others held")
        t0 = time.monotonic()
        health = requests.get(f"{gateway.url}/health", timeout=30)
        other = requests.get(f"{gateway.url}/endpoints/other/next", params={"wait": 0}, headers=OTHER,
                             timeout=30)
        answered_in = time.monotonic() - t0
        for poll in polls:
            poll.result()
    assert health.status_code == 200 and other.status_code == 204
    assert answered_in < 1.0, f"/health and another endpoint waited {answered_in:.1f} s"
    refused = [took for status, took in statuses if status == 429]
    assert len(refused) == 60 - cap and max(refused) < 2.0
    assert sorted(status for status, _ in statuses if status != 429) == [204] * cap
    # the slots are given back: a poll after them is accepted
    assert requests.get(f"{gateway.url}/endpoints/svc/next", params={"wait": 0}, headers=AUTH,
                        timeout=10).status_code == 204


def test_unknown_and_known_endpoints_answer_alike_without_a_token(served: Served) -> None:
    """Unknown endpoints answered 404 and known ones 401: names could be enumerated."""
    answers, gateway = [], served[1]
    for endpoint in ("svc", "nope", "other", "never-configured"):
        for headers in ({}, {"Authorization": "Bearer guess"}, AUTH if endpoint != "svc" else OTHER):
            reply = requests.get(f"{gateway.url}/endpoints/{endpoint}/next?wait=0", headers=headers,
                                 timeout=10)
            answers.append((reply.status_code, reply.json()["message"].replace(endpoint, "E")))
    assert set(answers) == {(401, answers[0][1])}, answers


def test_a_take_that_is_not_the_callers_is_refused_and_says_nothing(
        make_node: NodeFactory, served: Served) -> None:
    """With endpoint svc's own token on its own path, a response carrying endpoint other's request id
    got 200 ``{"delivery": "gone"}`` and a heartbeat ``the request is gone from Redis (expired)``.
    Both now refuse, the same way whether the request exists elsewhere or nowhere."""
    caller, gateway = make_node(), served[1]
    waiting = threading.Thread(target=lambda: _call_quietly(caller), daemon=True)
    waiting.start()
    taken = requests.get(f"{gateway.url}/endpoints/other/next", params={"wait": 5}, headers=OTHER,
                         timeout=10).json()
    replies = {}
    for request_id in (taken["id"], REQUEST):
        base = f"{gateway.url}/endpoints/svc/requests/{request_id}"
        response = requests.post(f"{base}/response", json={"take": taken["take"], "ok": True, "body": 1},
                                 headers=AUTH, timeout=10)
        beat = requests.post(f"{base}/heartbeat", json={"take": taken["take"]}, headers=AUTH, timeout=10)
        assert response.status_code == 409, response.text
        assert beat.status_code == 200 and beat.json()["cancelled"] is True
        for text in (response.text, beat.text):
            assert "gone" not in text and "expired" not in text and "Redis" not in text
        replies[request_id] = (response.json(), beat.json())
    assert replies[taken["id"]] == replies[REQUEST]
    # the request itself was not touched: its own endpoint's take still answers it
    good = requests.post(f"{gateway.url}/endpoints/other/requests/{taken['id']}/response",
                         json={"take": taken["take"], "ok": True, "body": 2}, headers=OTHER, timeout=10)
    assert good.json() == {"delivery": "delivered"}


def _call_quietly(caller: PendingQueue) -> None:
    with contextlib.suppress(Exception):  # the test's node closes under it
        caller.queue_and_wait("other", 1)


def test_a_polling_service_backs_off_when_its_endpoint_has_too_many_polls(
        make_node: NodeFactory, settings) -> None:
    """More pollers than the endpoint's bound: the ones refused (429) wait before they poll again,
    instead of polling in a loop."""
    from switchyard.pending.client import PollingService

    node = make_node(max_polls_per_endpoint=1, http_poll_wait_s=1.0)
    app = build_app(node, TokenStore.static(TOKENS))
    refused: list[float] = []

    def counting(event: dict, context: object) -> dict:
        reply = app.resolve(event, context)
        if reply["statusCode"] == 429:
            refused.append(time.monotonic())
        return reply

    with HttpGateway(counting, threads=16) as gw, \
            PollingService(gw.url, "svc", TOKENS["svc"], lambda r: r.body, settings=settings, concurrency=4):
        time.sleep(2.0)  # window: refused pollers back off (Retry-After); they do not hammer
    assert 1 <= len(refused) <= 3 * 4, f"{len(refused)} refused polls in 2 s"
