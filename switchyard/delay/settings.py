"""Settings of the delay scheduler: the seed's parameters with its defaults, plus topics and schema.

Every value comes from a ``SWITCHYARD_DELAY_*`` variable (docs/configuration.md) and is validated here,
once, so that a bad topic or schema name fails at start-up rather than in a query.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from switchyard.core.config import Setting, build
from switchyard.core.errors import ConfigError, InvalidNameError

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


# What an application reading the output topic should set on its consumer for low arrival latency,
# on tansu and on MSK alike (docs/delay.md quotes this; the benchmark's reader and the demo use it):
# a fetch returns as soon as one byte is there (fetch.min.bytes 1), an empty fetch waits at most
# 100 ms on the broker instead of 500, and librdkafka prefetches while the application works.
OUTPUT_CONSUMER_SETTINGS: dict[str, object] = {
    "fetch.min.bytes": 1,
    "fetch.wait.max.ms": 100,
    "queued.min.messages": 1000,
    "enable.auto.commit": True,
    "auto.commit.interval.ms": 1000,
}


def libpq_root_cert() -> str | None:
    """``PGSSLROOTCERT``, the root certificate this process names for libpq (libpq reads it itself; the
    store asks only whether one is named before it supplies the RDS bundle)."""
    return os.environ.get("PGSSLROOTCERT") or None


def validate_topic(name: str) -> str:
    """Return ``name`` if Kafka would accept it as a topic name, else raise InvalidNameError."""
    if not _TOPIC_RE.match(name) or name in (".", ".."):
        raise InvalidNameError(f"invalid Kafka topic name {name!r}: use 1-249 of [A-Za-z0-9._-]")
    return name


def validate_schema(name: str) -> str:
    """Return ``name`` if it is a plain lower-case Postgres identifier, else raise InvalidNameError."""
    if not _SCHEMA_RE.match(name) or name.startswith("pg_"):
        raise InvalidNameError(f"invalid Postgres schema name {name!r}: use [a-z_][a-z0-9_]{{0,62}}")
    return name


@dataclass(frozen=True)
class DelaySettings:
    """What one queuing node needs to know. Durations are milliseconds, as in the seed."""

    input_topic: str = "switchyard-delay-input"
    output_topic: str = "switchyard-delay-output"
    schema: str = "switchyard_delay"
    timing_advance_ms: int = 50
    hold_time_ms: int = 5000
    poll_interval_ms: int = 100
    # A node with nothing due sleeps until the earliest waiting deadline, or this long at most; an
    # enqueue wakes it sooner (Postgres NOTIFY), so this only bounds how late rows that no enqueue
    # announced (reset by failure detection, released by a peer) may be noticed.
    idle_poll_ms: int = 1000
    failure_detection_interval_ms: int = 500
    ready_batch_size: int = 2000
    publish_timeout_ms: int = 2000
    # The longest one Postgres operation may take before its connection is dropped (and opened again):
    # a server that stops answering without closing the connection (a half-open connection, a frozen
    # host) otherwise holds the thread forever, since the kernel still acknowledges what is sent.
    store_timeout_ms: int = 30_000
    # librdkafka's linger.ms for the output topic: how long a produced message may wait to share a
    # request with others. 5 ms halves the producer's and the broker's CPU per message at 10,000/s
    # against 1 ms; it delays arrival, not the firing time (the record's CreateTime is set at send).
    publish_linger_ms: int = 5
    # The largest message the output topic takes (MSK's default max.message.bytes); a larger one is
    # refused before sending and parked, instead of being retried forever.
    max_message_bytes: int = 1_000_000
    consumer_group: str = "switchyard-delay"
    batch_size: int = 1000
    batch_window_ms: int = 100
    application_name: str = "switchyard-delay"
    # A fire run whose worst timer lateness exceeds this is logged as a warning (the stack's alarm on
    # p99.9 lateness uses its own latenessSlaMs, 500 ms by default too).
    lateness_sla_ms: int = 500

    def __post_init__(self) -> None:
        validate_topic(self.input_topic)
        validate_topic(self.output_topic)
        validate_schema(self.schema)
        if self.input_topic == self.output_topic:
            raise ConfigError("the delay input and output topics must differ (messages would loop)")
        for name in ("hold_time_ms", "poll_interval_ms", "idle_poll_ms", "failure_detection_interval_ms",
                     "ready_batch_size", "publish_timeout_ms", "batch_size", "batch_window_ms",
                     "store_timeout_ms", "lateness_sla_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"delay setting {name} must be positive, got {getattr(self, name)}")
        if not 1000 <= self.max_message_bytes <= 1_000_000_000:
            raise ConfigError("delay setting max_message_bytes must be 1000..1000000000, "
                              f"got {self.max_message_bytes}")
        if self.publish_linger_ms < 0:
            raise ConfigError(f"delay setting publish_linger_ms must be >= 0, got {self.publish_linger_ms}")
        if self.timing_advance_ms < 0:
            raise ConfigError(f"delay setting timing_advance_ms must be >= 0, got {self.timing_advance_ms}")
        # A readied row is held in memory for up to advance + lookahead, then for the publish
        # confirmation: all of it must fit well inside the hold time or peers would take over
        # healthy work and fire it twice.
        held = self.timing_advance_ms + self.lookahead_ms + self.publish_timeout_ms
        if 2 * held > self.hold_time_ms:
            raise ConfigError(
                f"hold time {self.hold_time_ms} ms must be at least twice timing advance + poll interval"
                f" + publish timeout ({held} ms), or healthy nodes would be suspected of failure"
            )

    @property
    def lookahead_ms(self) -> int:
        """How far ahead phase 1 readies: two poll intervals, so the timer, not the poll, sets precision.

        With one, a row became claimable one interval before its firing time and the next claim came
        up to 10 % (the randomised interval) plus the query's own time later: a slice of the rows was
        claimed after its firing time. Two intervals leave a whole interval of slack for a slow claim.
        """
        return 2 * self.poll_interval_ms

    @property
    def ready_horizon(self) -> timedelta:
        """Rows with deadline <= now() + this are readied (timing advance plus lookahead)."""
        return timedelta(milliseconds=self.timing_advance_ms + self.lookahead_ms)

    @property
    def hold_time(self) -> timedelta:
        return timedelta(milliseconds=self.hold_time_ms)

    @property
    def stop_margin_ms(self) -> int:
        """Stop readying when less than this is left: enough to fire and confirm what is held."""
        return self.timing_advance_ms + self.lookahead_ms + self.publish_timeout_ms + 500

    @classmethod
    def from_env(cls, source: Mapping[str, str] | None = None) -> DelaySettings:
        """Every field from its ``SWITCHYARD_DELAY_<FIELD>`` (``DELAY``), else the seed's default."""
        return build(cls, DELAY, source)


def _delay(field: str, doc: str) -> Setting[Any]:
    """The setting of ``DelaySettings.<field>``: ``SWITCHYARD_DELAY_<FIELD>``, its default the field's and
    its unit the field's suffix."""
    unit = next((u for u in ("ms", "bytes") if field.endswith("_" + u)), "")
    return Setting(f"SWITCHYARD_DELAY_{field.upper()}", getattr(DelaySettings, field), doc, unit=unit)


DELAY: dict[str, Setting[Any]] = {field: _delay(field, doc) for field, doc in (
    ("input_topic", "where applications publish"),
    ("output_topic", "where delayed messages appear (must differ from the input)"),
    ("lateness_sla_ms",
     "a fire run whose worst timer lateness exceeds this logs a warning; each run logs one line: debug "
     "when nothing changed, info when it fired or its figures changed, warning when the overdue backlog "
     "grew or lateness passed the SLA (the deployment passes `latenessSlaMs`)"),
    ("schema", "Postgres schema (`[a-z_][a-z0-9_]*`)"),
    ("timing_advance_ms", "fire this much before the deadline"),
    ("hold_time_ms",
     "a ready message held longer is taken over by another node; must be >= 2 x (advance + poll interval"
     " + publish timeout)"),
    ("poll_interval_ms",
     "how often due messages are claimed while there are any (each fires at its own time, not at the "
     "poll)"),
    ("idle_poll_ms",
     "a node with nothing due sleeps until the earliest waiting deadline, or this long at most; an "
     "enqueue wakes it sooner (Postgres `NOTIFY`)"),
    ("failure_detection_interval_ms", "how often stuck ready messages are looked for"),
    ("ready_batch_size", "rows claimed per query"),
    ("publish_timeout_ms", "broker confirmation timeout; unconfirmed rows are handed back"),
    ("store_timeout_ms",
     "longest Postgres operation; past it the connection is dropped and opened again (a server gone "
     "silent without closing it)"),
    ("publish_linger_ms",
     "librdkafka `linger.ms` of the output producer: batching, at most this much later on the broker "
     "(the firing time is stamped at send)"),
    ("max_message_bytes",
     "the largest message the output topic takes (MSK's default `max.message.bytes`); a larger one is "
     "parked, not sent"),
    ("consumer_group", "consumer group of the local MSK bridge"),
    ("batch_size", "local bridge batching: records per batch (set the MSK mapping the same)"),
    ("batch_window_ms", "local bridge batching: the longest a batch waits (set the MSK mapping the same)"),
    ("application_name", "Postgres `application_name`"),
)}
