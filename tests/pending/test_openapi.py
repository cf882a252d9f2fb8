"""The node API's OpenAPI document against the API itself: every documented route is called through
the local gateway, and every answer's status and body must be what the document says (bodies are
``additionalProperties: false``: a field the API adds or drops fails here)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import requests

from switchyard.local.http_gateway import HttpGateway
from switchyard.pending import PendingQueue
from switchyard.pending.api import TokenStore, build_app
from switchyard.pending.openapi import openapi_document
from tests.pending.conftest import NodeFactory

TOKENS = {"svc": "s3cret-svc"}
AUTH = {"Authorization": f"Bearer {TOKENS['svc']}"}
REQUEST = "r" * 32


class Checked:
    """Calls the gateway and checks each answer against the document; remembers the routes called."""

    def __init__(self, url: str, document: dict[str, Any]) -> None:
        self.url, self.document = url, document
        self.called: set[tuple[str, str]] = set()

    def __call__(self, method: str, template: str, status: int, **kwargs: Any) -> Any:
        path = template.format(endpoint="svc", request_id=kwargs.pop("request_id", REQUEST))
        reply = requests.request(method, self.url + path, timeout=10, **kwargs)
        assert reply.status_code == status, reply.text
        operation = self.document["paths"][template][method]
        documented = operation["responses"].get(str(status))
        assert documented is not None, f"{method} {template} answered {status}, not in the document"
        self.called.add((template, method))
        content = documented.get("content")
        if not content:
            assert reply.content == b""
            return None
        assert reply.headers["Content-Type"].startswith("application/json")
        body = reply.json()
        schema = {**content["application/json"]["schema"], "components": self.document["components"]}
        jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)
        return body

    def request_body(self, template: str, body: Any) -> Any:
        """A body we send, checked against the document's request body."""
        schema = {**self.document["paths"][template]["post"]["requestBody"]["content"]["application/json"]
                  ["schema"], "components": self.document["components"]}
        jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)
        return body


@pytest.fixture
def node(make_node: NodeFactory) -> PendingQueue:
    return make_node(max_message_bytes=4096)


@pytest.fixture
def served(node: PendingQueue) -> Iterator[tuple[HttpGateway, dict[str, Any]]]:
    app = build_app(node, TokenStore.static(TOKENS))
    with HttpGateway(app, threads=8) as gateway:
        yield gateway, json.loads(openapi_document(app))


def test_the_document_is_served_at_the_bus_apis_path(served: tuple[HttpGateway, dict[str, Any]]) -> None:
    gateway, document = served
    reply = requests.get(gateway.url + "/openapi.json", timeout=10)  # no token: it is public, as the bus's
    assert reply.status_code == 200 and reply.headers["Content-Type"].startswith("application/json")
    assert reply.json() == document
    assert document["openapi"].startswith("3.1")
    assert document["info"]["title"] == "Switchyard pending node API"


def test_every_documented_route_answers_as_documented(
        served: tuple[HttpGateway, dict[str, Any]], make_node: NodeFactory) -> None:
    gateway, document = served
    check = Checked(gateway.url, document)
    NEXT = "/endpoints/{endpoint}/next"
    BEAT = "/endpoints/{endpoint}/requests/{request_id}/heartbeat"
    RESPOND = "/endpoints/{endpoint}/requests/{request_id}/response"

    assert check("get", "/health", 200)["ok"] is True
    check("get", NEXT, 204, params={"wait": 0.2}, headers=AUTH)
    check("get", NEXT, 401, params={"wait": 0})
    check("get", NEXT, 400, params={"wait": "soon"}, headers=AUTH)

    outcome: list[Any] = []
    caller = make_node()
    threading.Thread(target=lambda: outcome.append(caller.queue_and_wait("svc", {"n": 1}).body),
                     daemon=True).start()
    request = check("get", NEXT, 200, params={"wait": 5}, headers=AUTH)
    assert request["body"] == {"n": 1} and request["streams"] == []
    rid, take = request["id"], request["take"]
    beat = check("post", BEAT, 200, request_id=rid, headers=AUTH,
                 json=check.request_body(BEAT, {"take": take}))
    assert beat == {"cancelled": False, "reason": None}
    check("post", BEAT, 400, request_id=rid, headers=AUTH, json={})
    check("post", BEAT, 404, request_id="short", headers=AUTH, json={"take": take})
    check("post", BEAT, 401, request_id=rid, json={"take": take})
    check("post", RESPOND, 400, request_id=rid, headers=AUTH, json={"take": take, "ok": "yes"})
    check("post", RESPOND, 413, request_id=rid, headers=AUTH,
          json={"take": take, "ok": True, "body": "x" * 9000})
    check("post", RESPOND, 409, request_id=rid, headers=AUTH,
          json=check.request_body(RESPOND, {"take": "t" * 32, "ok": False, "error": "stale"}))
    answer = check("post", RESPOND, 200, request_id=rid, headers=AUTH,
                   json=check.request_body(RESPOND, {"take": take, "ok": True, "body": {"m": 2},
                                                     "streams": []}))
    assert answer == {"delivery": "delivered"}
    check("post", RESPOND, 404, request_id="short", headers=AUTH, json={"take": take, "ok": True})
    check("post", RESPOND, 401, request_id=rid, json={"take": take, "ok": True})
    stopped = check("post", BEAT, 200, request_id=rid, headers=AUTH, json={"take": take})
    assert stopped["cancelled"] is True and stopped["reason"]

    documented = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert check.called == documented


def test_two_apps_document_the_same(node: PendingQueue) -> None:
    """Each resolver gets its own responses (Powertools rewrites them in place while documenting)."""
    first = build_app(node, TokenStore.static(TOKENS))
    documents = [json.loads(openapi_document(first)), json.loads(openapi_document(first)),
                 json.loads(openapi_document(build_app(node, TokenStore.static(TOKENS))))]
    assert documents[0] == documents[1] == documents[2]
    assert {"NextRequest", "HeartbeatIn", "HeartbeatOut", "ResponseIn", "ResponseOut", "StreamRef",
            "ErrorOut", "NotHeldOut"} <= set(documents[0]["components"]["schemas"])


def test_the_503_is_documented_and_answered(served: tuple[HttpGateway, dict[str, Any]],
                                            node: PendingQueue) -> None:
    gateway, document = served
    node.client.set(node.pending_key("svc"), "not a list")
    body = Checked(gateway.url, document)("get", "/endpoints/{endpoint}/next", 503, params={"wait": 0.2},
                                          headers=AUTH)
    assert "WRONGTYPE" in body["message"]
