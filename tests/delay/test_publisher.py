"""The Kafka publisher on a private tansu that the tests stall, kill and restart (memory storage:
the restarted broker has forgotten every topic and producer id).

When messages time out, librdkafka bumps the idempotent producer's epoch without asking the
broker. Kafka accepts the new epoch; tansu answers PRODUCER_FENCED (a producer id it knows) or
UNKNOWN_PRODUCER_ID (after a restart), and librdkafka, deeming a retry safe, bumps again, forever:
every message times out and no error reaches the application. The publisher replaces such a
stuck producer; before, the stall test never got a message confirmed again, and the restart test
only now and then (when the refusal happened to be fatal)."""

from __future__ import annotations

import collections
import os
import signal
import time

import pytest

from switchyard.delay.publisher import KafkaPublisher
from tests.delay.conftest import OutputReader, Tansu, create_topics

TOPIC = "publisher-restart"


def send_ids(pub: KafkaPublisher, ids: list[str]) -> None:
    for i in ids:
        pub.send(i.encode(), b"v", [("test-id", i.encode())], i)


def written(bootstrap: str, ids: list[str]) -> collections.Counter[str]:
    """How many times each of ``ids`` is on the topic (waiting for every one to appear)."""
    reader = OutputReader(bootstrap, TOPIC)
    try:
        return collections.Counter(reader.wait_for_ids(set(ids), timeout=10))
    finally:
        reader.close()


def send_until_confirmed(pub: KafkaPublisher, ids: list[str], timeout_s: float) -> tuple[set[str], int]:
    """Send ``ids`` and send again each one reported failed, as the fire loop does with its rows,
    until all are confirmed or ``timeout_s`` passes. Returns (confirmed, failed deliveries)."""
    send_ids(pub, ids)
    confirmed: set[str] = set()
    failed = 0
    end = time.monotonic() + timeout_s
    while len(confirmed) < len(ids) and time.monotonic() < end:
        for d in pub.poll(0.05):
            assert isinstance(d.token, str)
            if d.error is None:
                confirmed.add(d.token)
            else:
                failed += 1
                pub.send(d.token.encode(), b"v", [("test-id", d.token.encode())], d.token)
    return confirmed, failed


def failures(pub: KafkaPublisher, expected: int, outage_s: float, at_most_s: float = 6.0) -> list[str]:
    """The tokens reported failed while the broker is away: polled for ``outage_s`` at least, then
    until ``expected`` have failed (librdkafka scans for timed-out messages once a second, later
    on a loaded machine), or ``at_most_s`` has passed."""
    failed: list[str] = []
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= at_most_s or (elapsed >= outage_s and len(failed) >= expected):
            return failed
        failed += [str(d.token) for d in pub.poll(0.05) if d.error is not None]


def warm_replacements(pub: KafkaPublisher) -> int:
    """Replacements before the fault: on a loaded machine the first connection to a fresh tansu can
    take longer than the publish timeout; the first messages time out, librdkafka bumps the epoch
    locally, and tansu answers "sequence gap" from then on, so the stuck producer is replaced
    (correctly) before the fault begins. What a test asserts about the fault counts from here."""
    assert pub.replacements <= 1, f"{pub.replacements} replacements while warming up"
    return pub.replacements


def test_a_producer_the_restarted_broker_keeps_refusing_is_replaced_without_duplicates(
    private_tansu: Tansu,
) -> None:
    """The broker restarts empty: while it is away the messages time out and the producer is kept
    (an unreachable broker is no reason to replace it); after, the restarted broker refuses the
    producer id, fatally or (depending on where the sequence stands) forever, and a replacement
    that loses the race with its own first timeouts gets fenced forever. The old publisher failed
    here in 2 of 5 runs (never a confirmation again). Every message is confirmed, and since
    the refused producer wrote nothing, none is written twice."""
    create_topics(private_tansu.bootstrap, TOPIC)
    pub = KafkaPublisher(private_tansu.bootstrap, TOPIC, timeout_ms=500, linger_ms=5)
    before = [f"a{i}" for i in range(20)]
    assert send_until_confirmed(pub, before, 10)[0] == set(before)  # (the first may time out connecting)
    warm = warm_replacements(pub)

    private_tansu.kill()
    during = [f"b{i}" for i in range(20)]
    send_ids(pub, during)
    failed = failures(pub, len(during), outage_s=2.0)  # they time out; 2 s of outage at least
    assert sorted(failed) == sorted(during) and pub.in_flight() == 0
    assert pub.replacements == warm, "an unreachable broker must not get the producer replaced"

    private_tansu.start()
    create_topics(private_tansu.bootstrap, TOPIC)
    # It reconnects; one message, alone in flight, until it is confirmed (resent while refused).
    confirmed, _ = send_until_confirmed(pub, during[:1], 20)
    confirmed |= send_until_confirmed(pub, during[1:], 10)[0]
    assert confirmed == set(during), (f"{len(during) - len(confirmed)} never confirmed after the restart "
                                      f"({pub.replacements} replacements)")
    assert pub.replacements >= warm + 1

    reader = OutputReader(private_tansu.bootstrap, TOPIC, partitions=None)
    try:
        reader.wait_for_ids(set(during), timeout=10)
        reader.poll(0.5)
        counts = collections.Counter(reader.ids())
    finally:
        reader.close()
    # The old broker's messages died with it; the refused producer wrote nothing, so no duplicates.
    assert {i: counts[i] for i in during} == dict.fromkeys(during, 1)


def test_a_producer_the_broker_fences_after_a_stall_is_replaced(private_tansu: Tansu) -> None:
    """The broker stalls (SIGSTOP) for 1.5 s: the messages in flight time out, librdkafka bumps the
    epoch, and tansu fences every request after that. Deterministic: the old publisher confirmed
    nothing in 15 s (about 50,000 failed deliveries), this one replaces the producer and goes on.

    On a loaded machine librdkafka now and then keeps the stalled messages without any report
    (measured: 1 stall in 50-70 with four busy loops on two cores; still unreported 20 s after the
    broker resumed, while new messages went through; the publisher's overdue guard, tested below,
    replaces such a producer). The fence under test never comes then: the stall is tried again on
    a fresh broker, at most three times."""
    for _ in range(3):
        if stall_once(private_tansu):
            return
        private_tansu.kill()
        private_tansu.start()
    pytest.fail("librdkafka kept the stalled messages without a report in each of 3 stalls")


def stall_once(private_tansu: Tansu) -> bool:
    """One stall and what follows; False if librdkafka reported none of the stalled messages."""
    create_topics(private_tansu.bootstrap, TOPIC)
    pub = KafkaPublisher(private_tansu.bootstrap, TOPIC, timeout_ms=500, linger_ms=5)
    before = [f"a{i}" for i in range(20)]
    assert send_until_confirmed(pub, before, 10)[0] == set(before)
    warm = warm_replacements(pub)
    assert private_tansu.proc is not None
    os.kill(private_tansu.proc.pid, signal.SIGSTOP)
    try:
        stalled = [f"s{i}" for i in range(20)]
        send_ids(pub, stalled)
        failed = failures(pub, len(stalled), outage_s=1.5, at_most_s=4.0)  # before the overdue guard
        if not failed:
            return False
        assert sorted(failed) == sorted(stalled)
        assert pub.replacements == warm, "a broker that does not answer must not get the producer replaced"
    finally:
        os.kill(private_tansu.proc.pid, signal.SIGCONT)
    confirmed, _ = send_until_confirmed(pub, stalled, 15)
    assert confirmed == set(stalled), f"{len(stalled) - len(confirmed)} never confirmed after the stall"
    assert pub.replacements == warm + 1
    seen = written(private_tansu.bootstrap, stalled)
    assert all(seen[i] >= 1 for i in stalled)  # (those the stalled broker wrote after all: twice)
    return True


def test_messages_kept_without_a_report_past_their_timeout_get_the_producer_replaced(
    private_tansu: Tansu,
) -> None:
    """The overdue guard, made to act before librdkafka's own timeout (5 s here, the guard at 1 s):
    what librdkafka keeps unreported is reported failed by the publisher (its rows released, not
    held for the rest of the run), the producer replaced; sent again, all are confirmed, none lost."""
    create_topics(private_tansu.bootstrap, TOPIC)
    pub = KafkaPublisher(private_tansu.bootstrap, TOPIC, timeout_ms=5000, linger_ms=5, overdue_after_s=1.0)
    assert send_until_confirmed(pub, ["w0", "w1"], 10)[0] == {"w0", "w1"}
    warm = warm_replacements(pub)
    assert private_tansu.proc is not None
    os.kill(private_tansu.proc.pid, signal.SIGSTOP)
    try:
        kept = [f"k{i}" for i in range(10)]
        send_ids(pub, kept)
        started = time.monotonic()
        errors: dict[str, str] = {}
        while len(errors) < len(kept) and time.monotonic() - started < 4.0:  # librdkafka's own: 5 s
            errors |= {str(d.token): str(d.error) for d in pub.poll(0.05) if d.error is not None}
        assert sorted(errors) == sorted(kept) and pub.in_flight() == 0, errors
        assert pub.replacements == warm + 1 and time.monotonic() - started >= 1.0
        # the guard's purge (or its release), not librdkafka's "Message timed out"
        assert all("Purged in flight" in e or "(overdue" in e for e in errors.values()), errors
    finally:
        os.kill(private_tansu.proc.pid, signal.SIGCONT)
    confirmed, _ = send_until_confirmed(pub, kept, 15)
    assert confirmed == set(kept)
    seen = written(private_tansu.bootstrap, kept)
    assert all(seen[i] >= 1 for i in kept)  # (what the stopped broker had taken in: twice)
