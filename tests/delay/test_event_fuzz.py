"""Property: nothing in one record of an aws:kafka event can raise out of reading and validating it.

Pure (no services): records_from_kafka_event + the enqueue validation, fed events that mix good
records with records a fuzzer mutated (fields removed or replaced by any JSON value, header values
of any JSON shape or out-of-range bytes, arbitrary deadline and id bytes). Every good record must
come out valid, every record must be accounted for (valid, repeated, or dropped with a position).
"""

from __future__ import annotations

from typing import Any

import pytest
from aws_lambda_powertools.utilities.data_classes import KafkaEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.core.errors import MalformedEventError
from switchyard.delay.enqueue import _validate
from switchyard.delay.model import Drop
from switchyard.delay.msk import records_from_kafka_event

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
BYTE_VALUES = st.lists(st.integers(min_value=-300, max_value=300), max_size=40)
FIELDS = ("topic", "partition", "offset", "timestamp", "timestampType", "key", "value", "headers")


def good(offset: int) -> dict[str, Any]:
    return {"topic": "in", "partition": 0, "offset": offset, "timestamp": 0, "timestampType": "CREATE_TIME",
            "value": "dg==", "headers": [{"chronosMessageId": list(f"good-{offset}".encode())},
                                         {"chronosDeadline": list(b"2030-01-01T00:00:00Z")}]}


@st.composite
def mutated(draw: st.DrawFn, offset: int) -> Any:
    record = good(offset)
    kind = draw(st.sampled_from(["replace", "remove", "header", "garbage", "bytes"]))
    if kind == "replace":
        record[draw(st.sampled_from(FIELDS))] = draw(JSON)
    elif kind == "remove":
        record.pop(draw(st.sampled_from(FIELDS)), None)
    elif kind == "header":
        record["headers"].append({draw(st.text(max_size=8)): draw(JSON | BYTE_VALUES)})
    elif kind == "bytes":
        name = draw(st.sampled_from(["chronosMessageId", "chronosDeadline"]))
        record["headers"] = [h for h in record["headers"] if name not in h] + [{name: draw(BYTE_VALUES)}]
    else:
        return draw(JSON)
    return record


@st.composite
def events(draw: st.DrawFn) -> tuple[dict[str, Any], set[str]]:
    records, good_ids = [], set()
    for offset in range(draw(st.integers(min_value=1, max_value=8))):
        if draw(st.booleans()):
            records.append(good(offset))
            good_ids.add(f"good-{offset}")
        else:
            records.append(draw(mutated(offset)))
    return {"eventSource": "aws:kafka", "records": {"in-0": records}}, good_ids


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events())
def test_no_record_can_raise_and_every_record_is_accounted_for(case: tuple[dict[str, Any], set[str]]) -> None:
    event, good_ids = case
    received, valid, sources, drops, repeats = _validate(records_from_kafka_event(KafkaEvent(event)))
    assert received == len(event["records"]["in-0"])
    assert good_ids <= set(valid)  # nothing good is lost next to a bad record
    assert len(valid) + repeats + len(drops) == received
    assert set(sources) == set(valid)
    assert all(isinstance(d.offset, int) and isinstance(d.partition, int) for d in drops)


def test_a_malformed_envelope_is_a_clear_error_and_a_malformed_partition_one_drop() -> None:
    """No event source mapping sends ``records`` that is not an object: refused, naming the shape
    (it was an AttributeError). A partition whose entry is not a list is one unreadable record (a
    Drop), and the partitions beside it are read."""
    for bad in (5, [], "x", None):
        with pytest.raises(MalformedEventError, match="not an aws:kafka event"):
            list(records_from_kafka_event(KafkaEvent({"eventSource": "aws:kafka", "records": bad})))
    read = list(records_from_kafka_event(KafkaEvent({"eventSource": "aws:kafka",
                                                     "records": {"in-0": 5, "in-1": [good(7)]}})))
    assert len(read) == 2 and isinstance(read[0], Drop) and "not a list" in read[0].detail
    assert not isinstance(read[1], Drop) and read[1].offset == 7
