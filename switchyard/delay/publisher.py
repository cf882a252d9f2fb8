"""confluent-kafka adapter of the Publisher port: idempotent, acks=all, confirmations via callbacks.

Not thread-safe by design: each thread that fires builds its own (delivery callbacks are served to
whoever polls, so a shared producer would hand one loop another's confirmations).

The idempotent producer is replaced (its unconfirmed messages reported failed, so their rows are
released) in three cases: librdkafka raised a fatal error, it is stuck, or it kept a message without
any report long past its timeout (``OVERDUE``). When messages time out,
librdkafka bumps the producer's epoch locally and restarts the sequence, which Kafka (MSK) accepts.
tansu does not: restarted with memory storage it answers every ProduceRequest with
UNKNOWN_PRODUCER_ID, and a batch that starts the fresh sequence is deemed safe to retry, so
librdkafka bumps the epoch again, never asks for a new producer id, and retries until every
message times out, forever (a batch further into the sequence fails fatally instead: the lucky
case); with a producer id it knows but a bumped epoch it answers PRODUCER_FENCED, likewise forever.
No error reaches the application: every message just times out. The producer counts as stuck when
the broker's answers keep forcing epoch bumps with nothing confirmed (see ``refusal``: librdkafka's
"eos" debug lines, the only place these answers show); bumps from local timeouts do not count, so
an outage where the broker is unreachable, or a restart that keeps producer state (MSK), never
replaces the producer (a replaced producer's unconfirmed messages are fired again: duplicates).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from typing import Generic

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from switchyard.core.msk_auth import kafka_security_config
from switchyard.core.observability import logger
from switchyard.delay.errors import BrokerError, MessageRefusedError
from switchyard.delay.model import Header
from switchyard.delay.ports import Delivery, Token
from switchyard.delay.settings import validate_topic

# Errors about one message itself: another attempt fails the same way (anything else may pass).
REFUSED_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG, KafkaError.INVALID_MSG_SIZE,
                           KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD})

# Stuck: the broker has refused the producer's idempotence state (an epoch bump or PID reset that
# a broker answer caused) this many times, for at least STUCK_AFTER_S (or a publish timeout, if
# longer), with no confirmation in between. Against a broker that supports epoch bumps (Kafka, MSK)
# one bump per partition is followed by confirmations.
STUCK_REFUSALS = 5
STUCK_AFTER_S = 1.0
PID_WAIT_S = 2.0
STUCK = "stuck: the broker keeps refusing its idempotence state"
# librdkafka reports every message by its timeout (its timeout scan runs once a second), yet now and
# then keeps some without any report, past the broker's return (seen on a loaded machine after a
# stall: 20 s and more). Such a producer is replaced once the oldest message is this far past its
# timeout (or a timeout, if longer): its rows are released to fire again, not held for the rest of
# the run.
OVERDUE_GRACE_S = 5.0
OVERDUE = "overdue: messages kept without a delivery report past their timeout"
OVERDUE_CHECK_S = 1.0


def refusal(facility: str, text: str) -> bool:
    """Whether a librdkafka "eos" debug line reports a drain for an epoch bump or a PID reset that a
    broker's answer caused (unknown producer id, fenced, sequence gap), not a local message timeout
    (messages timing out while the broker is unreachable bump the epoch too)."""
    if facility != "DRAIN" or not text.startswith("Beginning partition drain"):
        return False
    reason = text.rpartition("in-flight requests: ")[2]
    return "timed out" not in reason


class _LibrdkafkaLog:
    """librdkafka's ``logger``: lines of level INFO or above go to stderr as librdkafka writes them
    itself; debug lines (the "eos" context) go to ``on_debug`` only. Served by poll(), on the thread
    that polls."""

    _SYSLOG = {10: 7, 20: 6, 30: 4, 40: 3, 50: 2}  # Python logging level -> librdkafka's (syslog)

    def __init__(self, on_debug: Callable[[str, str], None]) -> None:
        self._on_debug = on_debug

    def log(self, level: int, _fmt: str, facility: str, name: str, text: str, *_: object) -> None:
        if level >= 20:
            print(f"%{self._SYSLOG.get(level, 6)}|{time.time():.3f}|{facility}|{name}| {text}",
                  file=sys.stderr, flush=True)
        else:
            self._on_debug(facility, text.partition("]: ")[2] or text)  # without "[thrd:...]: "


class KafkaPublisher(Generic[Token]):
    """Publishes to one topic and reports which messages the broker confirmed."""

    def __init__(self, bootstrap: str, topic: str, timeout_ms: int, linger_ms: int = 1,
                 max_message_bytes: int = 1_000_000, overdue_after_s: float | None = None) -> None:
        self.topic = validate_topic(topic)
        self._deliveries: list[Delivery[Token]] = []
        # number -> (token, when sent), in send order: the first is the oldest outstanding
        self._outstanding: dict[int, tuple[Token, float]] = {}
        self._next_overdue_check = 0.0
        self._sequence = itertools.count()
        self._fatal = False
        self._replace_reason = ""
        self._timeout_s = timeout_ms / 1000
        self._stuck_after_s = max(STUCK_AFTER_S, self._timeout_s)
        self._overdue_after_s = (self._timeout_s + max(OVERDUE_GRACE_S, self._timeout_s)
                                 if overdue_after_s is None else overdue_after_s)
        self._refusals = 0  # epoch bumps a broker answer caused, since the last confirmation
        self._first_refusal = 0.0
        self._has_pid = False
        self.replacements = 0
        self._config = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
            "message.timeout.ms": timeout_ms,
            "message.max.bytes": max_message_bytes,  # larger messages are refused (and parked) here
            "socket.connection.setup.timeout.ms": max(1000, timeout_ms),
            "reconnect.backoff.max.ms": 500,
            "client.id": "switchyard-delay",
            "error_cb": self._on_error,
            "debug": "eos",  # idempotence state changes, for refusal() (a few lines per change)
            "logger": _LibrdkafkaLog(self._on_debug),
            **kafka_security_config(),  # MSK on AWS: IAM (SASL/OAUTHBEARER); locally nothing
        }
        self._producer = Producer(self._config)

    def _on_error(self, err: KafkaError) -> None:
        # An idempotent producer turns fatal when the broker forgot its producer id (e.g. the
        # broker restarted with empty storage): it must be replaced, or it never sends again.
        if err.fatal():
            self._fail("fatal error", str(err))

    def _fail(self, reason: str, error: str) -> None:
        if not self._fatal:
            self._fatal = True
            self._replace_reason = reason
            logger.error(f"output producer failed ({reason}); replacing it",
                         extra={"error": error, "topic": self.topic})

    def _on_debug(self, facility: str, text: str) -> None:
        if facility == "GETPID" and text.startswith("Acquired PID"):
            self._has_pid = True
        if not refusal(facility, text):
            return
        now = time.monotonic()
        if self._refusals == 0:
            self._first_refusal = now
        self._refusals += 1
        if self._refusals >= STUCK_REFUSALS and now - self._first_refusal >= self._stuck_after_s:
            self._fail(STUCK,
                       f"{self._refusals} epoch bumps in {now - self._first_refusal:.1f} s with nothing "
                       f"confirmed; last: {text}")

    def _drain_old(self) -> None:
        """Before dropping the producer, learn what became of the requests it has in flight: the
        broker may still have written them (then reporting them failed would fire them twice).
        Queued messages, never sent, are purged; the in-flight ones are waited for, at most a
        publish timeout (the producer times them out by then), unless the producer is stuck: the
        broker refuses every request of it, so nothing in flight will be written."""
        old = self._producer
        with contextlib.suppress(KafkaException):
            old.purge(in_queue=True, in_flight=self._replace_reason in (STUCK, OVERDUE), blocking=False)
        end = time.monotonic() + self._timeout_s + 0.5
        while self._outstanding and len(old) and time.monotonic() < end:
            with contextlib.suppress(KafkaException):  # a fatal error may be raised again here
                old.poll(0.05)

    def _await_pid(self) -> None:
        """Give a new producer its producer id before handing it messages (it takes up to a second:
        librdkafka asks on a 500 ms timer; wait at most PID_WAIT_S or a publish timeout): messages
        that time out first make librdkafka bump an epoch it has not used yet, which a broker
        without epoch bumps (tansu) answers with ProducerFenced, for good (stuck again)."""
        self._producer.poll(0)  # connects
        end = time.monotonic() + max(PID_WAIT_S, self._timeout_s)
        while not self._has_pid and time.monotonic() < end:
            with contextlib.suppress(KafkaException):
                self._producer.poll(0.02)

    def _replace_if_fatal(self) -> None:
        if self._fatal:
            self._drain_old()
            released = len(self._outstanding)
            for token, _ in self._outstanding.values():  # never confirmed: report them failed
                self._deliveries.append(Delivery(token, f"producer replaced ({self._replace_reason})"))
            self._outstanding.clear()
            self._has_pid = False
            self._producer = Producer(self._config)
            self._fatal = False
            self._await_pid()
            self._refusals = 0
            self.replacements += 1
            logger.error("output producer replaced", extra={
                "reason": self._replace_reason, "unconfirmed_released": released,
                "replacements": self.replacements, "topic": self.topic})

    def _on_delivery(self, number: int) -> Callable[[KafkaError | None, Message], None]:
        def callback(err: KafkaError | None, _msg: Message) -> None:
            sent = self._outstanding.pop(number, None)
            if sent is None:
                return  # already reported failed when the producer was replaced
            token = sent[0]
            if err is None:
                self._refusals = 0
            elif err.fatal():
                self._fail("fatal delivery error", str(err))
            refused = err is not None and err.code() in REFUSED_CODES
            self._deliveries.append(Delivery(token, None if err is None else str(err), refused))
        return callback

    def send(self, key: bytes | None, value: bytes | None, headers: Sequence[Header], token: Token) -> None:
        """Queue a message; its Delivery comes back from a later poll()."""
        self._replace_if_fatal()
        number = next(self._sequence)
        while True:
            try:
                self._producer.produce(
                    self.topic, value=value, key=key, headers=list(headers),
                    on_delivery=self._on_delivery(number),
                )
                self._outstanding[number] = (token, time.monotonic())
                return
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let confirmations drain first
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                # After a fatal error, produce() raises _FATAL, whose own fatal() is False.
                if isinstance(error, KafkaError) and (error.fatal() or error.code() == KafkaError._FATAL):
                    self._fail("fatal error", str(exc))
                if isinstance(error, KafkaError) and error.code() in REFUSED_CODES:
                    raise MessageRefusedError(f"{self.topic} refuses this message: {error.str()}") from exc
                raise BrokerError(f"cannot produce to {self.topic}: {exc}") from exc

    def poll(self, timeout_s: float) -> list[Delivery[Token]]:
        try:
            self._producer.poll(max(0.0, timeout_s))
        except KafkaException as exc:  # a fatal error is raised here too, not only to error_cb
            self._fail("fatal error", str(exc))
        now = time.monotonic()
        if self._outstanding and now >= self._next_overdue_check:
            # Once a second: finding the oldest skips the slots of confirmed messages at the dict's
            # front, too many to walk at every poll of a busy fire loop.
            self._next_overdue_check = now + OVERDUE_CHECK_S
            waited = now - next(iter(self._outstanding.values()))[1]
            if waited > self._overdue_after_s:
                self._fail(OVERDUE, f"{len(self._outstanding)} unreported, the oldest for {waited:.1f} s")
        self._replace_if_fatal()
        out, self._deliveries = self._deliveries, []
        return out

    def in_flight(self) -> int:
        return len(self._outstanding)

    def flush(self, timeout_s: float) -> list[Delivery[Token]]:
        """Wait for every outstanding confirmation (up to ``timeout_s``) and return them."""
        self._producer.flush(max(0.0, timeout_s))
        return self.poll(0)
