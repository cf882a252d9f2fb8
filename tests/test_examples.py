"""examples/pricing as its image runs it: ``switchyard worker --handler pricing:quote`` with the
example's directory on PYTHONPATH (the Dockerfile's ``ENV PYTHONPATH=/app/handlers``), against the
real RabbitMQ, called through the client. The image itself needs Docker (tests/stacks/test_pool_images.py
checks what the deploy builds); this is the code inside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from switchyard.rpc import RpcClient
from tests.conftest import ROOT, subprocess_env, unique

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
