"""Names built from user input: pool validation, key -> routing key and key -> queue name."""

from __future__ import annotations

import re

import pytest

from switchyard.core.errors import InvalidNameError
from switchyard.rpc import protocol

ODD_KEYS = ["", "k" * 1024, "#", "*", ".", "-", "a key with spaces", "🚂💨", "%41", "A", "%2541",
            "~sha256:" + "0" * 64, "é" * 200, "x" * 255, "x" * 256]


def test_queue_names_are_unique_and_fit_the_limit() -> None:
    names = [protocol.request_queue("core", key) for key in ODD_KEYS]
    assert len(set(names)) == len(ODD_KEYS)
    assert all(len(name.encode()) <= protocol.MAX_NAME_BYTES for name in names)
    assert all(name.startswith("core-req-") for name in names)


def test_encoding_escapes_percent_so_encoded_looking_keys_do_not_collide() -> None:
    assert protocol.request_queue("core", "A") == "core-req-A"
    assert protocol.request_queue("core", "%41") == "core-req-%2541"
    assert protocol.request_queue("core", "a b") == "core-req-a%20b"
    assert protocol.request_queue("core", "infra=42,timetable=24") == "core-req-infra=42,timetable=24"


def test_long_keys_get_a_hashed_queue_name_with_a_readable_prefix() -> None:
    name = protocol.request_queue("core", "é" * 200)
    assert len(name.encode()) <= 255
    assert name.startswith("core-req-%C3%A9")
    assert name.endswith("~" + protocol.key_digest("é" * 200))
    head = name[len("core-req-"):].split("~")[0]
    assert head.count("%") * 3 == len(head)  # no %XX escape was cut in half


def test_routing_key_is_the_raw_key_when_amqp_allows_it() -> None:
    for key in ["", "#", "*", ".", "-", "a key with spaces", "🚂💨", "x" * 255]:
        assert protocol.routing_key(key) == key


def test_keys_too_long_for_amqp_or_using_the_reserved_prefix_are_hashed() -> None:
    long_key = "k" * 1024
    assert protocol.routing_key(long_key) == "~sha256:" + protocol.key_digest(long_key)
    reserved = "~sha256:" + protocol.key_digest(long_key)  # a short key forging a long key's route
    assert protocol.routing_key(reserved) != protocol.routing_key(long_key)
    assert protocol.routing_key(reserved).startswith(protocol.HASHED_ROUTING_PREFIX)


@pytest.mark.parametrize("pool", ["", "a-b", "a.b", "a*", "x" * 65, "spa ce", "é"])
def test_bad_pool_names_are_refused(pool: str) -> None:
    with pytest.raises(InvalidNameError):
        protocol.validate_pool(pool)


def test_keys_that_are_not_utf8_are_refused() -> None:
    with pytest.raises(InvalidNameError):
        protocol.request_queue("core", "\udcff")
    with pytest.raises(InvalidNameError):
        protocol.routing_key(b"bytes")  # type: ignore[arg-type]


def test_policy_pattern_matches_only_request_queues_of_its_pool() -> None:
    import re

    pattern = re.compile(protocol.request_policy_pattern("core"))
    assert pattern.match(protocol.request_queue("core", "42"))
    for other in ["core-orphan", "core-dl", "core-activity", "core-poison", "core2-req-42",
                  protocol.request_queue("score", "1"), "xcore-req-1"]:
        assert not pattern.match(other), other
    pool_queues = re.compile(protocol.pool_queues_policy_pattern("core"))
    assert all(pool_queues.match(q) for q in ["core-dl", "core-activity", "core-poison"])
    assert not pool_queues.match("core-orphan")
    assert not pool_queues.match("core-req-orphan") and not pool_queues.match("core-dl2")
    orphans = re.compile(protocol.orphan_policy_pattern("core"))
    assert orphans.match("core-orphan")
    assert not orphans.match("core-orphans") and not orphans.match("core-req-core-orphan")


def test_no_request_queue_has_the_request_exchanges_name() -> None:
    """So the request queues' permission pattern can leave the exchange out (no run-time configure)."""
    queue = protocol.request_queue("pool", "xchg")
    assert queue != protocol.req_exchange("pool")
    assert protocol.key_from_request_queue("pool", queue) == "xchg"
    assert not re.search(protocol.request_queues_pattern("pool"), protocol.req_exchange("pool"))
    assert re.search(protocol.request_queues_pattern("pool"), queue)
    assert protocol.key_from_request_queue("pool", protocol.req_exchange("pool")) is None


@pytest.mark.parametrize(("reply_to", "allowed"), [
    ("amq.rabbitmq.reply-to", True), ("amq.rabbitmq.reply-to.g2dkABC", True), ("amq.gen-abc", True),
    ("switchyard-reply-app.r1", True), ("", False), (None, False), ("pool-req-k1", False),
    ("pool-poison", False), ("amq.rabbitmq.reply-tox", False)])
def test_answers_go_only_to_reply_queues(reply_to: str | None, allowed: bool) -> None:
    assert protocol.replyable(reply_to) is allowed
