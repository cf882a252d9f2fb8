"""The bus API fuzzed from its own OpenAPI document (schemathesis): no input gets a 5xx.

Each operation gets ``SWITCHYARD_BUS_FUZZ_EXAMPLES`` generated requests (default 20, the CI form;
raise it for a longer run), sent over real HTTP with a valid token (root for ``/api_tokens``), so
that inputs reach validation and the Redis scripts rather than stopping at 401."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from switchyard.bus.api import build_app, openapi_document
from switchyard.bus.store import BusStore
from switchyard.core.redis_client import connect_redis
from switchyard.local.http_gateway import HttpGateway
from tests.bus.conftest import ROOT_KEY, drop_bus, fast_settings
from tests.conftest import unique

SCHEMA = schemathesis.openapi.from_dict(json.loads(openapi_document()))
EXAMPLES = int(os.environ.get("SWITCHYARD_BUS_FUZZ_EXAMPLES", "20"))


def basic(token: str) -> str:
    return "Basic " + base64.b64encode(f"{token}:x".encode()).decode()


@pytest.fixture(scope="module")
def fuzz_bus() -> Iterator[tuple[str, str]]:
    store = BusStore(connect_redis(), fast_settings(unique("fuzz")))
    client = store.create_token("fuzzer")
    store.publish("claimed", client, '{"topic":"claimed"}')
    gateway = HttpGateway(build_app(store), threads=8).start()
    try:
        yield gateway.url, client
    finally:
        gateway.stop()
        drop_bus(store)


@SCHEMA.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_generated_input_gets_a_server_error(case, fuzz_bus):
    url, client = fuzz_bus
    token = ROOT_KEY if case.path.startswith("/api_tokens") else client
    response = case.call(base_url=url, headers={"Authorization": basic(token)})
    case.validate_response(response, checks=[not_a_server_error])
