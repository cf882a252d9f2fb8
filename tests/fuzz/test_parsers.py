"""Fuzz the event parsers: every message of an ``aws:rmq`` or ``aws:kafka`` event comes out, good
ones exactly as sent, broken ones flagged (a problem, a Drop, an InvalidMessageError), and nothing
else is ever raised."""

from __future__ import annotations

from aws_lambda_powertools.utilities.data_classes import KafkaEvent
from hypothesis import given, settings
from hypothesis import strategies as st

from switchyard.delay.errors import InvalidMessageError
from switchyard.delay.model import Drop
from switchyard.delay.msk import records_from_kafka_event
from switchyard.delay.parsing import parse_record
from switchyard.rpc.control.rmq_event import decode_header_value, messages_from_event
from tests.fuzz.conftest import examples
from tests.fuzz.events import kafka_batch, kafka_event, rmq_event, rmq_message

KEYS = ["plain", "clé à espaces", "", "k" * 300]


def rmq_cases():
    return st.lists(st.one_of(rmq_message(reply_to="reply", keys=KEYS),
                              rmq_message(reply_to="reply", keys=KEYS, dead_letter=True),
                              rmq_message(reply_to="reply", keys=KEYS, activity=True)), max_size=10)


@settings(max_examples=examples(0.25))
@given(rmq_cases())
def test_rmq_event_messages_come_out_intact_or_flagged(cases: list) -> None:
    messages = list(messages_from_event(rmq_event(cases, "fuzz-q")))
    assert len(messages) == len(cases)
    for case, message in zip(cases, messages, strict=True):
        assert message.queue == "fuzz-q"
        if not case.good:
            assert message.problems, case.extra["breakage"]
            continue
        assert message.problems == (), message.problems
        assert message.body == case.extra["body"]
        assert message.key == case.key
        assert message.properties.correlation_id == case.ident
        for name, raw in case.message["basicProperties"]["headers"].items():
            assert message.headers[name] == decode_header_value(raw)


@settings(max_examples=examples(0.25))
@given(kafka_batch(topic="fuzz-in", max_size=10))
def test_kafka_records_are_read_or_dropped_and_parse_or_are_refused(cases: list) -> None:
    items = list(records_from_kafka_event(KafkaEvent(kafka_event(cases, "fuzz-in"))))
    assert len(items) == len(cases)
    for case, item in zip(cases, items, strict=True):
        if isinstance(item, Drop):
            assert not case.good, item
            continue
        try:
            message = parse_record(item)
        except InvalidMessageError:
            assert not case.good, case.extra["breakage"]
            continue
        assert case.good, f"a record with a broken {case.extra['breakage']} was accepted"
        assert message.id == case.ident
        assert list(message.headers) == case.extra["headers"][2:]  # binary, null and non-ASCII intact
