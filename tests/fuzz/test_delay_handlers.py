"""Fuzz the delay scheduler's handlers (functions/delay_*.py) on the real Postgres and tansu.

Enqueue: a generated MSK batch mixes good Chronos messages with broken records; the handler must
return a partial batch response naming no record (nothing transient happened), store every good
message, and count every broken record in ``DelayRecordsDropped``. Fire and sweep: any scheduled
event is accepted, and due messages are fired.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as fuzz_settings
from hypothesis import strategies as st

from switchyard.delay.service import DelayService
from switchyard.local.functions import load_function
from switchyard.local.lambda_context import FakeLambdaContext
from tests.delay.conftest import (  # noqa: F401 - fixtures
    OutputReader,
    connections,
    handler_service,
    in_ms,
    message,
    output,
    settings,
    store,
)
from tests.delay.test_enqueue import emf_metric
from tests.fuzz.conftest import examples
from tests.fuzz.events import kafka_batch, kafka_event, scheduled_event


@pytest.fixture(autouse=True)
def _metrics_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drop count is read from the EMF blob the handler prints."""
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")


def invoke(function: str, event: dict[str, Any], timeout_ms: int = 30_000) -> Any:
    return load_function(function).lambda_handler(event, FakeLambdaContext(function, timeout_ms))


@fuzz_settings(max_examples=examples(0.12))
@given(data=st.data())
def test_enqueue_stores_every_good_message_and_counts_every_broken_record(
    handler_service: DelayService, capsys: pytest.CaptureFixture[str], data: st.DataObject,  # noqa: F811
) -> None:
    topic = handler_service.settings.input_topic
    cases = data.draw(kafka_batch(topic=topic))
    capsys.readouterr()
    response = invoke("delay_enqueue", kafka_event(cases, topic))
    assert response == {"batchItemFailures": []}
    good = [c.ident for c in cases if c.good]
    assert handler_service.store.existing_ids(good) == set(good)
    assert emf_metric(capsys, "DelayRecordsDropped") == sum(not c.good for c in cases)


@fuzz_settings(max_examples=examples(0.002))
@given(scheduled_event())
def test_fire_takes_any_scheduled_event_and_fires_what_is_due(
    handler_service: DelayService, output: OutputReader, event: dict[str, Any],  # noqa: F811
) -> None:
    ids = [f"fire-{uuid.uuid4().hex[:8]}-{n}" for n in range(2)]
    handler_service.store.insert([message(i, in_ms(-100)) for i in ids])
    budget = handler_service.settings.stop_margin_ms + 500
    invoke("delay_fire", event, budget)
    assert set(ids) <= set(output.wait_for_ids(set(ids), 5))


@fuzz_settings(max_examples=examples(0.002))
@given(scheduled_event())
def test_sweep_takes_any_scheduled_event(handler_service: DelayService, event: dict[str, Any]) -> None:  # noqa: F811
    outcome = invoke("delay_sweep", event, 600)
    assert outcome["store_errors"] == 0
