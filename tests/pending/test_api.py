"""The node API over real HTTP (the local API Gateway): polling services, long polls, bad input."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict

import pytest
import requests

from switchyard.aws import services
from switchyard.local.http_gateway import HttpGateway
from switchyard.pending import CancelledError, CancelToken, PendingQueue, PendingSettings, RemoteError
from switchyard.pending.api import TokenStore, build_app
from switchyard.pending.client import PollingService, ServiceRequest
from tests.pending.conftest import NodeFactory

TOKENS = {"svc": "s3cret-svc", "other": "s3cret-other"}


@pytest.fixture
def node_b(make_node: NodeFactory) -> PendingQueue:
    return make_node(max_message_bytes=4096)


@pytest.fixture
def gateway(node_b: PendingQueue) -> Iterator[HttpGateway]:
    with HttpGateway(build_app(node_b, TokenStore.static(TOKENS)), threads=64) as gw:
        yield gw


def service(gateway: HttpGateway, settings: PendingSettings, handler, endpoint: str = "svc",
            **kwargs) -> PollingService:
    return PollingService(gateway.url, endpoint, TOKENS[endpoint], handler, settings=settings, **kwargs)


def test_polling_service_on_node_b_answers_a_caller_on_node_a(
        make_node: NodeFactory, gateway: HttpGateway, settings: PendingSettings) -> None:
    node_a = make_node()
    with service(gateway, settings, lambda request: {"echo": request.body}, concurrency=2) as svc:
        assert node_a.queue_and_wait("svc", {"n": 1}).body == {"echo": {"n": 1}}
        assert [node_a.queue_and_wait("svc", n).body for n in range(20)] == [{"echo": n} for n in range(20)]
    assert svc.handled == 21


def test_service_errors_reach_the_caller(make_node: NodeFactory, gateway: HttpGateway,
                                         settings: PendingSettings) -> None:
    def broken(request: ServiceRequest) -> None:
        raise KeyError("no such file")

    with service(gateway, settings, broken), pytest.raises(RemoteError, match="KeyError: 'no such file'"):
        make_node().queue_and_wait("svc", 1)


def test_caller_cancel_reaches_the_handler_through_heartbeats(
        make_node: NodeFactory, gateway: HttpGateway, settings: PendingSettings) -> None:
    started, seen = threading.Event(), []

    def slow(request: ServiceRequest) -> str:
        started.set()
        seen.append(request.cancel.wait(10) and request.cancel.reason)
        return "done"

    cancel = CancelToken()
    with service(gateway, settings, slow):
        threading.Thread(target=lambda: started.wait(10) and cancel.cancel("user gave up"),
                         daemon=True).start()
        with pytest.raises(CancelledError, match="after pickup"):
            make_node().queue_and_wait("svc", 1, cancel=cancel)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
    assert seen == ["the caller cancelled the request"]


def test_long_poll_waits_then_answers_204(gateway: HttpGateway) -> None:
    started = time.monotonic()
    reply = requests.get(f"{gateway.url}/endpoints/svc/next", params={"wait": 0.5},
                         headers={"Authorization": f"Bearer {TOKENS['svc']}"}, timeout=10)
    assert reply.status_code == 204
    assert 0.4 < time.monotonic() - started < 3


def test_a_pop_redis_refuses_is_a_503_with_its_reason(gateway: HttpGateway, node_b: PendingQueue) -> None:
    """The pending list's key holds a string: the long poll answers 503 saying why (the polling
    service backs off and polls again), not a 500 without a message."""
    node_b.client.set(node_b.pending_key("svc"), "not a list")
    reply = requests.get(f"{gateway.url}/endpoints/svc/next", params={"wait": 0.2},
                         headers={"Authorization": f"Bearer {TOKENS['svc']}"}, timeout=10)
    assert reply.status_code == 503
    assert "WRONGTYPE" in reply.json()["message"]


def test_long_poll_ends_before_the_lambda_time_runs_out(node_b: PendingQueue) -> None:
    """3 s left in the invocation: the long poll returns after 1 s (2 s margin), inside API Gateway's 29 s."""
    with HttpGateway(build_app(node_b, TokenStore.static(TOKENS)), timeout_ms=3000) as gw:
        started = time.monotonic()
        reply = requests.get(f"{gw.url}/endpoints/svc/next", params={"wait": 20},
                             headers={"Authorization": f"Bearer {TOKENS['svc']}"}, timeout=30)
        assert reply.status_code == 204
        assert time.monotonic() - started < 5  # not the 20 s asked for


def test_settings_refuse_a_long_poll_longer_than_api_gateway_allows() -> None:
    from switchyard.core.errors import ConfigError

    with pytest.raises(ConfigError, match="29 s"):
        PendingSettings(http_poll_wait_s=29)


AUTH = {"Authorization": f"Bearer {TOKENS['svc']}"}
REQUEST = "r" * 32


@pytest.mark.parametrize("method,path,kwargs,status,message", [
    ("get", "/endpoints/nope/next", {"headers": AUTH}, 401, "missing or wrong token"),  # as a known one
    ("get", "/endpoints/svc/next", {}, 401, "missing or wrong token"),
    ("get", "/endpoints/svc/next", {"headers": {"Authorization": "Bearer wrong"}}, 401, "or wrong token"),
    ("get", "/endpoints/other/next", {"headers": AUTH}, 401, "missing or wrong token"),  # another endpoint's
    ("get", "/endpoints/svc/next?wait=soon", {"headers": AUTH}, 400, "wait must be a number"),
    ("post", f"/endpoints/svc/requests/{REQUEST}/response", {"headers": AUTH, "data": "{not json"}, 400,
     "malformed JSON"),
    ("post", f"/endpoints/svc/requests/{REQUEST}/response", {"headers": AUTH, "json": [1]}, 400,
     "must be a JSON object"),
    ("post", f"/endpoints/svc/requests/{REQUEST}/response", {"headers": AUTH, "json": {"ok": True}}, 400,
     '"take"'),
    ("post", f"/endpoints/svc/requests/{REQUEST}/response",
     {"headers": AUTH, "json": {"take": "t1", "ok": 1}}, 400, '"ok" must be'),
    ("post", f"/endpoints/svc/requests/{REQUEST}/response",
     {"headers": AUTH, "json": {"take": "t1", "ok": True, "body": "x" * 10_000}}, 413, "over"),
    ("post", f"/endpoints/svc/requests/{REQUEST}/response",
     {"headers": AUTH, "json": {"take": "t1", "ok": True, "streams": [{"id": 1}]}}, 400, "malformed stream"),
    ("post", "/endpoints/svc/requests/short/heartbeat", {"headers": AUTH, "json": {"take": "t1"}}, 404,
     "no request"),
    ("get", "/nothing/here", {}, 404, "Not found"),
])
def test_bad_input_gets_a_clear_error(gateway: HttpGateway, method: str, path: str, kwargs: dict,
                                      status: int, message: str) -> None:
    reply = getattr(requests, method)(f"{gateway.url}{path}", timeout=10, **kwargs)
    assert reply.status_code == status, reply.text
    assert message in reply.json()["message"]


def test_a_response_with_a_stale_take_is_refused(make_node: NodeFactory, gateway: HttpGateway) -> None:
    outcome: list[object] = []
    caller = make_node()
    threading.Thread(target=lambda: outcome.append(caller.queue_and_wait("svc", 1).body), daemon=True).start()
    request = requests.get(f"{gateway.url}/endpoints/svc/next", params={"wait": 5}, headers=AUTH,
                           timeout=10).json()
    url = f"{gateway.url}/endpoints/svc/requests/{request['id']}/response"
    stale = requests.post(url, json={"take": "t" * 32, "ok": True, "body": 2}, headers=AUTH, timeout=10)
    assert stale.status_code == 409 and "does not hold" in stale.json()["message"]
    good = requests.post(url, json={"take": request["take"], "ok": True, "body": 2}, headers=AUTH, timeout=10)
    assert good.json() == {"delivery": "delivered"}
    unknown = requests.post(f"{gateway.url}/endpoints/svc/requests/{REQUEST}/response",
                            json={"take": "t1", "ok": True}, headers=AUTH, timeout=10)
    assert unknown.status_code == 409 and unknown.json()["delivery"] == "not_taker"  # as a stale take
    deadline = time.monotonic() + 5
    while not outcome and time.monotonic() < deadline:
        time.sleep(0.05)
    assert outcome == [2]


def test_heartbeat_of_an_unknown_request_says_stop(gateway: HttpGateway) -> None:
    reply = requests.post(f"{gateway.url}/endpoints/svc/requests/{REQUEST}/heartbeat", json={"take": "t1"},
                          headers=AUTH, timeout=10)
    assert reply.status_code == 200
    assert reply.json() == {"cancelled": True, "reason": "this take does not hold the request"}


def test_wrong_token_stops_the_polling_service_with_a_clear_error(gateway: HttpGateway,
                                                                  settings: PendingSettings) -> None:
    svc = PollingService(gateway.url, "svc", "wrong", lambda r: None, settings=settings)
    with pytest.raises(Exception, match="HTTP 401"):
        svc.run_forever()


def test_the_lambda_handler_behind_the_gateway(monkeypatch: pytest.MonkeyPatch, make_node: NodeFactory,
                                               settings: PendingSettings) -> None:
    """functions/pending_api.py exactly as Lambda loads it, behind the local API Gateway."""
    monkeypatch.setenv("SWITCHYARD_PENDING_PREFIX", settings.prefix)
    monkeypatch.setenv("SWITCHYARD_PENDING_TOKENS", json.dumps({"svc": TOKENS["svc"]}))
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    sys.modules.pop("functions.pending_api", None)
    module = importlib.import_module("functions.pending_api")
    try:
        with HttpGateway(module.lambda_handler, function_name="pending-api") as gw, \
                service(gw, settings, lambda request: request.body * 2):
            assert make_node().queue_and_wait("svc", 21).body == 42
            assert requests.get(f"{gw.url}/endpoints/x/next", timeout=10).status_code == 401
    finally:
        if services.pending_node.built:
            services.pending_node()[0].close()
        services.pending_node.install(None)
        sys.modules.pop("functions.pending_api", None)


def test_token_store_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from switchyard.core.errors import ConfigError

    monkeypatch.setenv("SWITCHYARD_PENDING_TOKENS", '{"a": "t"}')
    store = TokenStore.from_env()
    assert store.known("a") and store.check("a", "t") and not store.check("a", "x") and not store.known("b")
    assert store.endpoints() == ["a"]
    monkeypatch.setenv("SWITCHYARD_PENDING_TOKENS", '{"a": 1}')
    with pytest.raises(ConfigError, match="JSON object"):
        TokenStore.from_env()
    # No SWITCHYARD_PENDING_* variables: seed 002's defaults (connections follow the environment,
    # e.g. AWS_ENDPOINT_URL under ./dev).
    from_env = dataclasses.replace(PendingSettings.from_env(), connections=PendingSettings().connections)
    assert asdict(from_env) == asdict(PendingSettings())


def test_concurrent_requests_keep_their_own_token_while_a_long_poll_waits(make_node: NodeFactory) -> None:
    """Powertools keeps the current request in class attributes: shared by the server's threads,
    a request could be checked against another's token. Requests take turns, and a long poll hands
    its turn back while it waits, so it neither blocks the others nor loses its own request."""
    node = make_node(http_poll_wait_s=3.0)
    gateway = HttpGateway(build_app(node, TokenStore.static(TOKENS)), threads=32).start()
    url = f"{gateway.url}/endpoints"
    poll: dict[str, float | int] = {}

    def long_poll() -> None:
        started = time.monotonic()
        answer = requests.get(f"{url}/svc/next?wait=3", headers={"Authorization": f"Bearer {TOKENS['svc']}"},
                              timeout=10)
        poll.update(status=answer.status_code, took=time.monotonic() - started)

    waiter = threading.Thread(target=long_poll)
    waiter.start()
    time.sleep(0.3)
    started = time.monotonic()
    calls = [("other", TOKENS["other"], 204), ("other", "wrong", 401), ("svc", TOKENS["other"], 401)] * 8

    def call(case: tuple[str, str, int]) -> int:
        endpoint, token, _ = case
        return requests.get(f"{url}/{endpoint}/next?wait=0", headers={"Authorization": f"Bearer {token}"},
                            timeout=10).status_code

    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(12) as pool:
            statuses = list(pool.map(call, calls))
        took = time.monotonic() - started
        waiter.join(10)
    finally:
        gateway.stop()
    assert statuses == [expected for _, _, expected in calls]
    assert took < 2.0, f"the others waited for the long poll ({took:.1f} s)"
    assert poll["status"] == 204 and 2.5 <= poll["took"] < 6


def test_a_request_carries_its_callers_trace_to_the_polling_service_and_its_handler(
        make_node: NodeFactory, gateway: HttpGateway, settings: PendingSettings, tmp_path,
        monkeypatch) -> None:
    """Queued inside a request's trace, the pending request carries it: through ``next`` to the
    polling service, whose handler runs with its trace id as the logger's correlation id."""
    from switchyard.core import tracing
    from switchyard.core.observability import logger

    log = tmp_path / "trace.jsonl"
    monkeypatch.setenv(tracing.TRACE_LOG_ENV, str(log))
    seen: list[tuple[str | None, str | None]] = []

    def handler(request: ServiceRequest) -> str:
        seen.append((request.traceparent, logger.thread_safe_get_current_keys().get("correlation_id")))
        return "ok"

    node_a = make_node()
    caller_trace = tracing.new_trace()
    with service(gateway, settings, handler):
        with tracing.scope(caller_trace):
            assert node_a.queue_and_wait("svc", {"n": 1}).body == "ok"
        assert node_a.queue_and_wait("svc", {"n": 2}).body == "ok"  # no trace in hand: a new one
    (first, first_id), (second, second_id) = seen
    assert tracing.parse(first).trace_id == caller_trace.trace_id == first_id
    assert tracing.parse(first).span_id != caller_trace.span_id  # the caller's own span for the request
    assert tracing.parse(second).trace_id == second_id != caller_trace.trace_id
    assert [h["event"] for h in tracing.read_hops(caller_trace.trace_id, str(log))] == ["queued", "handled"]
