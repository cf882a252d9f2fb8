"""The delay scheduler under faults: messages into the input topic, fired to the output topic.

``switchyard delay run`` (bridge, fire loop and sweep, in one subprocess) runs against a
throwaway schema and topics. Messages are produced in chunks that share a deadline, so the fire
loop holds a whole batch when a fault lands. Every produced message carries a ``test-id`` header
that the scheduler relays; the output topic is read from the beginning and each id counted.
Only messages the input broker confirmed are in the account (an unconfirmed one was never sent).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from switchyard.core.config import Connections
from switchyard.delay.store import PostgresDelayStore
from tests.conftest import unique, wait_for
from tests.delay.conftest import (
    OutputReader,
    Tansu,
    chronos_headers,
    create_topics,
    delete_topics,
    free_port,
    terminate_backends,
)
from tests.faults.account import Account, recovery_after
from tests.faults.procs import Service


@dataclass(frozen=True)
class DelaySize:
    chunks: int
    chunk: int  # messages per chunk; a chunk shares one deadline, so it fires as one batch
    every: float  # seconds between chunks, in production and in deadlines
    delay: float = 2.0  # from the first chunk's production to its deadline
    produce_every: float | None = None  # produce faster than the deadlines advance (None: ``every``)
    gap: tuple[float, float] | None = None  # no deadline in this window (seconds after the start)
    settle: float = 30.0  # after the last deadline, how long the account waits for what is missing

    @property
    def messages(self) -> int:
        return self.chunks * self.chunk


@dataclass
class Plan:
    """When each chunk is produced and when it is due, in seconds after the traffic's start."""

    chunks: list[tuple[float, float, list[str]]] = field(default_factory=list)

    @classmethod
    def of(cls, size: DelaySize) -> Plan:
        plan, n, due = cls(), 0, size.delay
        produce_every = size.every if size.produce_every is None else size.produce_every
        for i in range(size.chunks):
            if size.gap and size.gap[0] <= due < size.gap[1]:
                due = size.gap[1]
            plan.chunks.append((i * produce_every, due, [f"m{n + j}" for j in range(size.chunk)]))
            n += size.chunk
            due += size.every
        return plan

    def last_due(self) -> float:
        return max(due for _, due, _ in self.chunks)


class DelayRig:
    """A throwaway schema and topic pair, ``switchyard delay run`` on them, and an output reader."""

    def __init__(self, workdir: Path, bootstrap: str | None = None,
                 node_env: Mapping[str, str] | None = None) -> None:
        self.connections = Connections.from_env()
        self.bootstrap = bootstrap or self.connections.kafka_bootstrap
        self.name = unique("faults_delay")
        self.input, self.output = f"{self.name}-in", f"{self.name}-out"
        self.node = Service(["delay", "run"], {
            "SWITCHYARD_KAFKA_BOOTSTRAP": self.bootstrap, "SWITCHYARD_DELAY_INPUT_TOPIC": self.input,
            "SWITCHYARD_DELAY_OUTPUT_TOPIC": self.output, "SWITCHYARD_DELAY_SCHEMA": self.name,
            "SWITCHYARD_DELAY_CONSUMER_GROUP": f"{self.name}-g",
            "SWITCHYARD_DELAY_APPLICATION_NAME": self.name,
            "SWITCHYARD_DELAY_HOLD_TIME_MS": "2000", "SWITCHYARD_DELAY_PUBLISH_TIMEOUT_MS": "500",
            "SWITCHYARD_DELAY_FAILURE_DETECTION_INTERVAL_MS": "250", "SWITCHYARD_DELAY_BATCH_WINDOW_MS": "50",
            **(node_env or {}),
        }, workdir / f"delay-{self.name}.log", tag=self.name)
        self.reader: OutputReader | None = None
        self.store = PostgresDelayStore(self.connections.postgres_dsn, self.name, f"{self.name}-harness")

    def __enter__(self) -> DelayRig:
        create_topics(self.bootstrap, self.input, self.output)
        self.node.start()
        self.reader = OutputReader(self.bootstrap, self.output)
        return self

    def __exit__(self, *exc: object) -> None:
        self.node.stop()
        if self.reader is not None:
            self.reader.close()
        self.store.drop_schema()
        self.store.close()
        delete_topics(self.bootstrap, self.input, self.output)

    def new_reader(self) -> None:
        """A fresh reader that keeps what the old one read (after the broker lost its topics).

        It reads every partition the new topic has: the scheduler's producer may have auto-created
        it (with the broker's default count) before the harness created it with two.
        """
        assert self.reader is not None
        old, self.reader = self.reader, OutputReader(self.bootstrap, self.output, partitions=None)
        if self.reader.partitions != 2:
            print(f"faults: {self.output} has {self.reader.partitions} partitions after the restart "
                  "(auto-created by a client before the harness created it)", file=sys.stderr, flush=True)
        self.reader.messages = old.messages
        old.close()

    def waiting(self) -> int:
        """Rows still in the store (waiting or ready); 0 before the schema exists."""
        try:
            return sum(self.store.counts())
        except Exception:
            return -1


class DelayTraffic:
    """Produces the plan's chunks on schedule (one producer, every message confirmed)."""

    def __init__(self, rig: DelayRig, plan: Plan) -> None:
        self.rig = rig
        self.plan = plan
        self.start_s = time.time()
        self.confirmed: list[str] = []
        self.unconfirmed: list[str] = []
        self.faults: list[tuple[float, float]] = []  # (start, end) of each fault, time.time() like the plan
        self.produced_all = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"produce-{rig.name}", daemon=True)
        self.error: BaseException | None = None

    def at(self, seconds: float) -> None:
        """Sleep until ``seconds`` after the start."""
        time.sleep(max(0.0, self.start_s + seconds - time.time()))  # pace: the plan's clock

    def start(self) -> DelayTraffic:
        self.start_s = time.time()
        self._thread.start()
        return self

    def _run(self) -> None:
        producer = Producer({"bootstrap.servers": self.rig.bootstrap, "enable.idempotence": True,
                             "acks": "all", "message.timeout.ms": 10_000, "linger.ms": 5})

        def delivered(err: object, msg: object) -> None:
            rid = msg.key().decode()  # type: ignore[attr-defined]
            (self.unconfirmed if err else self.confirmed).append(rid)

        try:
            for produce_at, due, ids in self.plan.chunks:
                self.at(produce_at)
                deadline = datetime.fromtimestamp(self.start_s + due, UTC)
                for rid in ids:
                    producer.produce(self.rig.input, key=rid.encode(), value=b"v", on_delivery=delivered,
                                     headers=[*chronos_headers(f"{self.rig.name}-{rid}", deadline),
                                              ("test-id", rid.encode())])
                producer.poll(0)
            producer.flush(30)
        except BaseException as exc:
            self.error = exc
        finally:
            self.produced_all.set()

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def fault_over(self, started: float) -> None:
        """Mark a fault that began at ``started`` (time.time()) as over now."""
        self.faults.append((started, time.time()))

    def recovery(self, fired: list[Any]) -> float | None:
        """From a fault's end until every message due before it (and not fired before it began)
        fired: each message's CreateTime is set by the scheduler's producer as it fires."""
        confirmed = set(self.confirmed)
        due = {rid: self.start_s + at for _, at, ids in self.plan.chunks for rid in ids if rid in confirmed}
        fired_at: dict[str, float] = {}
        for msg in fired:
            rid = dict(msg.headers() or []).get("test-id", b"").decode()
            fired_at.setdefault(rid, msg.timestamp()[1] / 1000)
        return recovery_after(self.faults, due, fired_at)


Fault = Callable[[DelayRig, DelayTraffic], int]


def run_delay(scenario: str, fault: Fault, size: DelaySize, workdir: Path, bootstrap: str | None = None,
              on_rig: Callable[[DelayRig], None] | None = None,
              node_env: Mapping[str, str] | None = None) -> Account:
    """Produce the plan while ``fault`` runs; the account once everything due has had time to fire.
    ``node_env``: settings of ``switchyard delay run`` only (a service through a proxy, say)."""
    with DelayRig(workdir, bootstrap, node_env) as rig:
        if on_rig is not None:
            on_rig(rig)
        start = time.monotonic()
        traffic = DelayTraffic(rig, Plan.of(size)).start()
        faults = fault(rig, traffic)
        traffic.join()
        assert rig.reader is not None
        expected = set(traffic.confirmed)
        end = traffic.start_s + traffic.plan.last_due() + size.settle  # hold time, sweep, restarts
        while time.time() < end and not expected <= set(rig.reader.poll(0.2) and rig.reader.ids()):
            pass
        rig.reader.poll(1.0)  # late duplicates
        seen = Counter(rig.reader.ids())
        note = f"{len(traffic.unconfirmed)} not confirmed by the input broker" if traffic.unconfirmed else ""
        return Account.settle(scenario, traffic.confirmed, seen, time.monotonic() - start, faults, note,
                              traffic.recovery(rig.reader.messages))


# -- faults --------------------------------------------------------------------------------------
def kill_fire_loop(rig: DelayRig, traffic: DelayTraffic) -> int:
    """SIGKILL ``switchyard delay run`` while it fires a chunk (just after the chunk's firing time)."""
    chunks = traffic.plan.chunks
    kills = 0
    for index in (len(chunks) // 3, 2 * len(chunks) // 3):
        traffic.at(chunks[index][1] - 0.045)  # the chunk fires at its deadline minus the 50 ms advance
        rig.node.sigkill()
        kills += 1
        time.sleep(0.5)  # pace: down for half a second
        rig.node.start()
    return kills


def kill_postgres_connections(rig: DelayRig, traffic: DelayTraffic) -> int:
    """pg_terminate_backend of every connection of the scheduler, four times during the run."""
    last = traffic.plan.last_due()
    killed = 0
    for at in (0.3, 0.5, 0.7, 0.9):
        traffic.at(at * last)
        killed += terminate_backends(rig.connections.postgres_dsn, rig.name)
    return killed


def restart_kafka(broker: Tansu, kill_at: float) -> Fault:
    """Kill the (private, in-memory) Kafka broker at ``kill_at`` s, once every message is stored;
    start it again 2 s later.

    Its topics are gone with it: the harness creates them again, as an operator would, and reads
    the output from the new broker. Use a plan whose deadlines leave a gap before the kill: a
    message the old broker confirmed but the reader had not fetched yet would be lost by the
    broker's memory storage, not by the scheduler.
    """

    def fault(rig: DelayRig, traffic: DelayTraffic) -> int:
        traffic.produced_all.wait()
        assert rig.reader is not None
        total = len(traffic.confirmed)
        wait_for(lambda: rig.waiting() + len(set(rig.reader.poll(0.1) and rig.reader.ids())) >= total,
                 timeout=20, what="every message stored before the broker restart")
        # Read up to the kill, not after it: the chunk due at the gap's end fires 50 ms before its
        # deadline, and what the old broker confirmed of it but the reader had not fetched would
        # die with the broker's memory (the kill used to come after a further 0.5 s of reading).
        while time.time() < traffic.start_s + kill_at:
            rig.reader.poll(min(0.1, max(0.0, traffic.start_s + kill_at - time.time())))
        broker.kill()
        time.sleep(2.0)  # pace: the broker stays down 2 s
        broker.start()
        create_topics(rig.bootstrap, rig.input, rig.output)
        rig.new_reader()
        return 1

    return fault


def private_kafka(workdir: Path) -> Tansu:
    """A tansu of the suite's own on a free port, so restarting it disturbs nobody."""
    return Tansu(free_port(), workdir / "tansu-faults.log")
