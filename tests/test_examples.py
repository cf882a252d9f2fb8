"""examples/pricing as its image runs it: ``switchyard worker --handler pricing:quote`` with the
example's directory on PYTHONPATH (the Dockerfile's ``ENV PYTHONPATH=/app/handlers``), against the
real RabbitMQ, called through the client. The image itself needs Docker (tests/stacks/test_pool_images.py
checks what the deploy builds); this is the code inside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from switchyard.core.config import Connections
from switchyard.delay.settings import DelaySettings
from switchyard.delay.store import PostgresDelayStore
from switchyard.local.delay_runtime import LocalRuntime
from switchyard.rpc import RpcClient
from tests.conftest import ROOT, subprocess_env, unique
from tests.delay.conftest import OutputReader, create_topics, delete_topics

EXAMPLE = ROOT / "examples" / "pricing"


def switchyard(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "switchyard", *args], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"switchyard {' '.join(args)}: {done.stderr}"


@pytest.fixture
def pricing_worker():
    """A pool of this test's own with one key bound, and the example's worker serving it."""
    pool, key = unique("examples"), "tenant=acme"
    switchyard("pool", "init", "--pool", pool)
    worker = None
    try:
        switchyard("pool", "bind", "--pool", pool, "--key", key)
        # The example's directory and this checkout's package, as the image has them.
        worker = subprocess.Popen(
            [sys.executable, "-m", "switchyard", "worker", "--handler", "pricing:quote"],
            env=subprocess_env(PYTHONPATH=os.pathsep.join([str(EXAMPLE), str(ROOT)]), WORKER_POOL=pool,
                               WORKER_KEY=key, PYTHONDONTWRITEBYTECODE="1"),
            cwd=EXAMPLE.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        yield pool, key
    finally:
        if worker is not None:
            worker.terminate()
            out, _ = worker.communicate(timeout=30)
            assert worker.returncode == 0, out
        switchyard("pool", "delete", "--pool", pool, "--force")


def test_the_pricing_example_answers_orders_and_rejects_bad_ones(pricing_worker) -> None:
    pool, key = pricing_worker
    order = {"items": [{"sku": "BOLT-M8", "quantity": 100}, {"sku": "NUT-M8", "quantity": 100}]}
    with RpcClient(pool, timeout=30) as client:
        response = client.call(key, json.dumps(order).encode())
        assert response.ok, response.text()
        priced = json.loads(response.body)
        assert (priced["tenant"], priced["subtotal"], priced["discount"], priced["total"]) == (
            "acme", 1700, 170, 1530)
        bad = client.call(key, json.dumps({"items": [{"sku": "NOPE", "quantity": 1}]}).encode())
        assert bad.status == "error"
        assert json.loads(bad.body) == {"error": "ValueError", "message": "unknown sku 'NOPE'"}
        # The worker goes on after a bad order.
        assert client.call(key, b'{"items": [{"sku": "WASHER-M8", "quantity": 1}]}').ok


# -- examples/delay_producer ---------------------------------------------------------------------
PRODUCER = ROOT / "examples" / "delay_producer" / "producer.py"


@pytest.fixture
def scheduler() -> Iterator[DelaySettings]:
    """The delay scheduler (enqueue and fire) on topics and a schema of this test's own."""
    connections = Connections.from_env()
    name = unique("example")
    settings = DelaySettings(input_topic=f"{name}-in", output_topic=f"{name}-out", schema=name,
                             consumer_group=f"{name}-g", application_name=name, batch_window_ms=20)
    create_topics(connections.kafka_bootstrap, settings.input_topic, settings.output_topic)
    runtime = LocalRuntime(settings, connections, roles=("enqueue", "fire"))
    runtime.start()
    try:
        yield settings
    finally:
        runtime.join()
        with PostgresDelayStore(connections.postgres_dsn, settings.schema) as dropping:
            dropping.drop_schema()
        delete_topics(connections.kafka_bootstrap, settings.input_topic, settings.output_topic)


def produce_example(settings: DelaySettings, *args: str) -> str:
    done = subprocess.run([sys.executable, str(PRODUCER), *args], capture_output=True, text=True, timeout=60,
                          env=subprocess_env(SWITCHYARD_DELAY_INPUT_TOPIC=settings.input_topic))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_delay_producer_example_is_held_until_its_deadline(scheduler: DelaySettings) -> None:
    reader = OutputReader(Connections.from_env().kafka_bootstrap, scheduler.output_topic)
    try:
        started = datetime.now(UTC)
        message_id = produce_example(scheduler, "--in", "2s", "--key", "order-17",
                                     "--value", '{"remind": true}', "--header", "test-id=plain")
        call_id = produce_example(scheduler, "--in", "1s", "--key", "infra=42", "--value", "report",
                                  "--pool", "core", "--id", "call-17", "--header", "test-id=call")
        assert call_id == "call-17" and len(message_id) == 32
        assert sorted(reader.wait_for_ids({"plain", "call"}, timeout=30)) == ["call", "plain"]
        by_id = {dict(m.headers())[b"test-id".decode()].decode(): m for m in reader.messages}
        plain, call = by_id["plain"], by_id["call"]
        assert (plain.key(), plain.value()) == (b"order-17", b'{"remind": true}')
        # Fired at the deadline less the timing advance (50 ms), never sooner.
        fired = datetime.fromtimestamp(plain.timestamp()[1] / 1000, UTC)
        assert fired >= started + timedelta(seconds=2) - timedelta(milliseconds=60)
        assert "chronosDeadline" not in dict(plain.headers())  # the scheduler's own two stay behind
        assert dict(call.headers()) == {"x-switchyard-pool": b"core", "x-switchyard-key": b"infra=42",
                                        "x-switchyard-id": b"call-17", "test-id": b"call"}
    finally:
        reader.close()


def test_the_delay_producer_example_refuses_a_bad_delay() -> None:
    done = subprocess.run([sys.executable, str(PRODUCER), "--in", "soon", "--key", "k"], capture_output=True,
                          text=True, timeout=60, env=subprocess_env())
    assert done.returncode == 2 and "use a number and ms, s, m or h" in done.stderr
