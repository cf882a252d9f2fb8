"""The delay scheduler's demo: Chronos messages through Kafka and Postgres, fired at their deadlines."""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

from switchyard.core.latency import LatencySummary
from switchyard.demo.printer import Printer

# One fired message: its id, then seconds past its deadline when published (CreateTime) and received.
Fired = tuple[str, float, float]


def delay_scheduler_part(out: Printer, messages: int = 300) -> None:
    """The delay scheduler on the local stack: ``messages`` Chronos messages with delays of 1-5 s go
    through a fresh input topic, the local runtime (enqueue bridge, fire and sweep loops) publishes
    each at its deadline, and a reader with the recommended consumer settings counts and times them."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from switchyard.core.config import Connections
    from switchyard.delay.model import DEADLINE_HEADER, MESSAGE_ID_HEADER
    from switchyard.delay.parsing import format_deadline
    from switchyard.delay.settings import OUTPUT_CONSUMER_SETTINGS, DelaySettings
    from switchyard.delay.store import PostgresDelayStore
    from switchyard.local.delay_runtime import LocalRuntime

    name = f"demo_delay_{uuid.uuid4().hex[:6]}"
    settings = DelaySettings(input_topic=f"{name}-in", output_topic=f"{name}-out", schema=name,
                             consumer_group=f"{name}-g", application_name=name)
    connections = Connections.from_env()
    out.section(f"Delay scheduler: {messages} messages due 1-5 s after they are sent, through "
                f"{settings.input_topic} -> Postgres -> {settings.output_topic}")
    admin = AdminClient({"bootstrap.servers": connections.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(t, 2, 1) for t in (settings.input_topic,
                                                                   settings.output_topic)]).values():
        future.result(15)
    local = LocalRuntime(settings, connections)
    store = PostgresDelayStore(connections.postgres_dsn, name)
    reader = Consumer({**OUTPUT_CONSUMER_SETTINGS, "bootstrap.servers": connections.kafka_bootstrap,
                       "group.id": f"{name}-reader"})
    reader.assign([TopicPartition(settings.output_topic, p, -2) for p in range(2)])
    deadlines: dict[str, datetime] = {}
    fired: list[Fired] = []
    try:
        local.start()
        time.sleep(3.0)  # the enqueue bridge joins its consumer group
        producer = Producer({"bootstrap.servers": connections.kafka_bootstrap, "acks": "all"})
        rnd = random.Random(13)
        for n in range(messages):
            message_id = f"{name}-{n}"
            deadlines[message_id] = datetime.now(UTC) + timedelta(seconds=rnd.uniform(1.0, 5.0))
            producer.produce(settings.input_topic, value=f"delayed #{n}".encode(), headers=[
                (MESSAGE_ID_HEADER, message_id.encode()),
                (DEADLINE_HEADER, format_deadline(deadlines[message_id]).encode())])
        producer.flush(10)
        out.line(f"sent {messages} messages; the latest is due at "
                 f"{max(deadlines.values()).strftime('%H:%M:%S.%f')[:-3]} UTC")
        until = time.monotonic() + 20
        while len(fired) < messages and time.monotonic() < until:
            msg = reader.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            received = time.time()
            for m in [msg, *reader.consume(500, 0)]:  # what came with it, stamped at the same moment
                value = cast(bytes, m.value())  # the demo's messages all have a value
                message_id = f"{name}-{int(value.decode().rsplit('#', 1)[1])}"
                deadline = deadlines[message_id].timestamp()
                fired.append((message_id, m.timestamp()[1] / 1000 - deadline, received - deadline))
        until = time.monotonic() + 3  # a fired row is deleted once the broker confirmed it
        while store.counts() != (0, 0) and time.monotonic() < until:
            time.sleep(0.1)
    finally:
        reader.close()
        local.join()
        left = store.counts()
        store.drop_schema()
        store.close()
        admin.delete_topics([settings.input_topic, settings.output_topic])
    report_fired(out, fired, messages, left, settings.timing_advance_ms)
    plot_jitter(out, fired, messages, Path(tempfile.gettempdir()) / f"{name}-jitter.png")


def report_fired(out: Printer, fired: list[Fired], messages: int, left: tuple[int, int],
                 timing_advance_ms: int) -> None:
    """Exactly once or not, and how far from its deadline each message was published and received."""
    counts = Counter(f[0] for f in fired)
    fire = LatencySummary.of([f[1] for f in fired])
    arrival = LatencySummary.of([f[2] for f in fired])
    out.line(f"fired {len(counts)} of {messages}, {sum(1 for c in counts.values() if c == 1)} exactly once, "
             f"{sum(c - 1 for c in counts.values())} duplicates, {messages - len(counts)} missing; "
             f"rows left in Postgres (waiting, ready): {left}")
    out.line(f"published vs deadline: p50 {fire.p50_ms:+.0f} ms, p99 {fire.p99_ms:+.0f} ms, "
             f"max {fire.max_ms:+.0f} ms (the timing advance fires {timing_advance_ms} ms early "
             "by design)")
    out.line(f"received by a reader vs deadline: p50 {arrival.p50_ms:+.0f} ms, p99 {arrival.p99_ms:+.0f} ms, "
             f"max {arrival.max_ms:+.0f} ms (adds the local broker and the reader's fetch)")


def plot_jitter(out: Printer, fired: list[Fired], messages: int, plot: Path) -> None:
    """A histogram of the lateness, when matplotlib is there (a dev dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        out.line("no jitter plot: matplotlib is not installed (pip install -r requirements-dev.txt)")
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.hist([f[1] * 1000 for f in fired], bins=60, histtype="step", label="published (CreateTime)")
    ax.hist([f[2] * 1000 for f in fired], bins=60, histtype="step", label="received by the reader")
    ax.set(xlabel="ms after the deadline", ylabel="messages",
           title=f"Delay scheduler demo: {messages} messages")
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot, dpi=100)
    plt.close(fig)
    out.line(f"jitter plot written to {plot}")
