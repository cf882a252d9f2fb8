"""Strangers' clients (issue 34): malformed messages at every consumer while normal traffic runs.

One pool under ``switchyard local`` and one delay scheduler (``switchyard delay run``, its relay
publishing into that pool) carry calls (``RpcTraffic``) and scheduled calls (records on the input
topic for the pool). Meanwhile a plain pika client and a plain Kafka producer send the shapes of
``strangers.py``, seeded, at the workers (the request exchange, a warm key), the orphan bridge (a
new key), the dead-letter bridge (its exchange), the activity bridge, the relay (the output topic)
and the enqueue handler (the input topic).

The account: normal traffic lost 0; each stranger the broker or Kafka took is accounted for, in
``{pool}-poison`` with ``x-switchyard-poison-reason``, in the scheduler's ``parked_messages`` with
its reason, dropped with its reason (the enqueue handler's log line naming the record), or served
as any message (handled by a worker, fired, consumed by the activity bridge); no forged
``x-switchyard-user-id`` reached a handler; and no consumer restarted more than once (a worker
group's exits, a bridge's reconnects or failed batches; a bridge thread that died counts as for
ever). The poison queue is read with a header skimmer of its own (``strangers.read_queue``): pika
cannot decode what it holds, and RabbitMQ 4.0's management API answers 500 for a header name that
is not UTF-8.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pika
import pika.exceptions
import psycopg
from confluent_kafka import Producer

from switchyard.core import observability
from switchyard.delay.parsing import format_deadline
from switchyard.local.metrics_shipper import cloudwatch_client
from switchyard.rpc import protocol
from switchyard.rpc.scheduling import ScheduledCall, scheduled_headers
from tests.conftest import wait_for
from tests.faults import strangers
from tests.faults.account import Account
from tests.faults.delay import DelayRig
from tests.faults.handlers import handled_key
from tests.faults.rpc import RpcRig, RpcSize, RpcTraffic

SEED = 34
# The counters the parts emit, shipped to CloudWatch (LocalStack) as the local runtime does.
METRICS_ON = {"SWITCHYARD_SHIP_METRICS": "1", "SWITCHYARD_METRICS_FLUSH_INTERVAL_S": "1"}


@dataclass(frozen=True)
class StrangerSize:
    calls: RpcSize
    scheduled: int  # scheduled calls, due over the run
    amqp: int  # AMQP strangers, in three bursts
    kafka: int  # Kafka strangers, in the same bursts
    settle: float = 25.0  # after the traffic, how long strangers and scheduled calls have to settle


# The calls' timeout: long enough that a loaded machine's slow worker restart is not a loss, short
# enough to bound a failing run (the traffic waits three of them for the last answers).
SIZES = {"full": StrangerSize(RpcSize(1200, 8, 40, timeout=45.0), 300, 240, 160),
         "short": StrangerSize(RpcSize(240, 4, 20, timeout=45.0), 40, 48, 24)}


class Strangers:
    """Sends strangers and keeps those the broker confirmed / Kafka acknowledged."""

    def __init__(self, rpc: RpcRig, delay: DelayRig) -> None:
        self.rpc, self.delay = rpc, delay
        self.sent: list[strangers.Stranger] = []
        self.refused: Counter[str] = Counter()  # shape -> the broker would not take it
        self.positions: dict[tuple[int, int], str] = {}  # (partition, offset) on the input topic -> id
        self._connection: pika.BlockingConnection | None = None

    def _channel(self) -> Any:
        if self._connection is None or self._connection.is_closed:
            url = self.rpc.settings.connections.amqp_url
            self._connection = pika.BlockingConnection(pika.URLParameters(url))
            self._amqp = self._connection.channel()
            self._amqp.confirm_delivery()
        return self._amqp

    def send_amqp(self, batch: Iterable[strangers.Stranger], warm_key: str) -> None:
        pool = self.rpc.pool
        for stranger in batch:
            exchange, routing_key = {
                strangers.WORKER: (protocol.req_exchange(pool), protocol.routing_key(warm_key)),
                # a new key: a cold start
                strangers.ORPHAN: (protocol.req_exchange(pool), f"stranger-{stranger.id}"),
                strangers.DEAD_LETTER: (protocol.dl_exchange(pool), warm_key),
                strangers.ACTIVITY: (protocol.activity_exchange(pool), warm_key),
            }[stranger.target]
            try:
                user = urlsplit(self.rpc.settings.connections.amqp_url).username or "guest"
                self._channel().basic_publish(exchange, routing_key, stranger.id.encode(),
                                              stranger.properties(user))
                self.sent.append(stranger)
            except (pika.exceptions.AMQPError, ValueError) as exc:  # the broker closed on it: not sent
                self.refused[f"{stranger.shape}: {type(exc).__name__}"] += 1
                self._connection = None

    def send_kafka(self, batch: Iterable[strangers.Stranger]) -> None:
        producer = Producer({"bootstrap.servers": self.delay.bootstrap, "acks": "all",
                             "message.max.bytes": 2_000_000, "message.timeout.ms": 10_000})

        def delivered(stranger: strangers.Stranger, err: object, msg: Any) -> None:
            if err is not None:
                self.refused[f"{stranger.shape}: {err}"[:80]] += 1
                return
            self.sent.append(stranger)
            if msg.topic() == self.delay.input:
                self.positions[(msg.partition(), msg.offset())] = stranger.id

        for stranger in batch:
            topic = self.delay.output if stranger.target == strangers.RELAY else self.delay.input
            value = stranger.id.encode() if stranger.value is None else stranger.value
            producer.produce(topic, key=stranger.id.encode(), value=value, headers=stranger.kafka,
                             on_delivery=lambda err, msg, st=stranger: delivered(st, err, msg))
        producer.flush(30)

    def close(self) -> None:
        if self._connection is not None and self._connection.is_open:
            self._connection.close()


def schedule_calls(rig: DelayRig, pool: str, count: int, over_s: float) -> list[str]:
    """Scheduled calls into ``pool`` (warm and new keys), due over ``over_s``; the ids Kafka took."""
    producer = Producer({"bootstrap.servers": rig.bootstrap, "acks": "all", "enable.idempotence": True})
    confirmed: list[str] = []
    now = datetime.now(UTC)
    for n in range(count):
        call = ScheduledCall(f"s{n}", pool, "fault-0" if n % 3 else f"scheduled-{n % 2}", f"s{n}".encode())
        deadline = now + timedelta(seconds=1 + over_s * n / count)
        producer.produce(rig.input, key=call.key.encode(), value=call.body,
                         headers=scheduled_headers(call, deadline),
                         on_delivery=lambda err, _m, cid=call.id: err is None and confirmed.append(cid))
    producer.flush(30)
    return confirmed


def poison_messages(amqp_url: str, queue: str) -> dict[str, str]:
    """Body -> poison reason of every message in ``queue`` (taken)."""
    return {body.decode("utf-8", "replace"): str(headers.get(protocol.POISON_REASON_HEADER, ""))
            for body, headers in strangers.read_queue(amqp_url, queue)}


def parked_reasons(rig: DelayRig) -> dict[str, str]:
    """Value -> reason of the scheduler's parked records (the record's value is the stranger's id)."""
    with psycopg.connect(rig.connections.postgres_dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT message_value, reason FROM {rig.name}.parked_messages").fetchall()
    return {bytes(v or b"").decode("utf-8", "replace"): reason or "" for v, reason in rows}


_FIELD = re.compile(r"(\w+)=(\S+)")
RESTARTS = {"worker exited": "group_id", "lost its connection; reconnecting": "queue",
            "the whole batch will be delivered again": "function_name",
            "handler failed; the batch will be delivered again": "function_name",
            "publishing scheduled calls failed": "function_name"}  # the relay's partition comes again


def restarts(*logs: Path) -> Counter[str]:
    """Consumer -> restarts (or failed batches) in these logs; a thread that died: 1,000."""
    found: Counter[str] = Counter()
    for log in logs:
        for line in log.read_text(errors="replace").splitlines() if log.exists() else ():
            if line.startswith("Exception in thread"):
                found[line[:80]] += 1000
            for marker, name in RESTARTS.items():
                if marker in line:
                    fields = dict(_FIELD.findall(line))
                    found[f"{marker.split(';')[0]} {fields.get(name, log.stem)}"] += 1
    return found


def counters(services: Iterable[str], since: datetime, timeout: float = 15.0) -> Counter[str]:
    """The counters of bad messages the parts shipped to CloudWatch (LocalStack) under ``services``
    since ``since`` (to the minute), summed by name; polled until two reads agree (the shipper
    sends every second, LocalStack aggregates a little later)."""
    cw = cloudwatch_client()
    namespace = observability.metrics_namespace()
    since = since.replace(second=0, microsecond=0)
    reads: list[Counter[str]] = [Counter()]

    def two_reads_agree() -> bool:
        found: Counter[str] = Counter()
        for service in services:
            listed = cw.list_metrics(Namespace=namespace, Dimensions=[{"Name": "service", "Value": service}])
            for metric in listed["Metrics"]:
                if not COUNTED.search(metric["MetricName"]):
                    continue
                points = cw.get_metric_statistics(
                    Namespace=namespace, MetricName=metric["MetricName"], Dimensions=metric["Dimensions"],
                    StartTime=since, EndTime=datetime.now(UTC) + timedelta(minutes=1), Period=60,
                    Statistics=["Sum"])["Datapoints"]
                found[metric["MetricName"]] += int(sum(point["Sum"] for point in points))
        reads.append(found)
        return bool(found) and found == reads[-2]

    wait_for(two_reads_agree, timeout, interval=2.0, required=False)
    return +reads[-1]


COUNTED = re.compile(r"Poison|Parked|Dropped|Malformed|WithoutKey|Unknown|Undecodable|InvalidKey|Expired")
# The counters of messages set aside (poisoned, parked, dropped), one family per consumer; the
# workers are not Lambda functions: each one set aside is a log line of the worker (and its stats).
SET_ASIDE = re.compile(r"Poisoned|Undecodable|InvalidKey|WithoutKey|Parked|Dropped")
WORKER_POISONED = "sent to the poison inventory"


def worker_poisoned(workers: Path) -> int:
    return sum(log.read_text(errors="replace").count(WORKER_POISONED) for log in workers.glob("*.log"))


def _dropped(log: Path, topic: str) -> set[tuple[int, int]]:
    text = log.read_text(errors="replace") if log.exists() else ""
    return {(int(a), int(b)) for a, b in re.findall(rf"dropped record {re.escape(topic)}/(\d+)/(\d+)", text)}


def run_strangers(scenario: str, size: StrangerSize, workdir: Path, seed: int = SEED) -> Account:
    rng = random.Random(seed)
    with RpcRig(workdir, plane_env=METRICS_ON) as rpc, DelayRig(workdir, node_env=METRICS_ON) as delay:
        start, since = time.monotonic(), datetime.now(UTC)
        traffic = RpcTraffic(rpc.pool, rpc.settings, size.calls).start()
        run_s = size.calls.requests / size.calls.rate
        scheduled = schedule_calls(delay, rpc.pool, size.scheduled, run_s)
        sender = Strangers(rpc, delay)
        amqp = strangers.amqp_strangers(rng, size.amqp)
        deadline = lambda: format_deadline(datetime.now(UTC) + timedelta(seconds=1))  # noqa: E731
        kafka = strangers.kafka_strangers(rng, rpc.pool, size.kafka, deadline)
        # The first burst once a worker answers: the warm key's strangers are then a worker's.
        wait_for(lambda: traffic.answers or not traffic.progress() < 0.5, timeout=60, what="a first answer")
        try:
            for burst, at in enumerate((0.2, 0.45, 0.7)):
                traffic.wait_progress(at)
                sender.send_amqp(amqp[burst::3], warm_key=traffic.key("r0"))
                sender.send_kafka(kafka[burst::3])
        finally:
            sender.close()
        traffic.join()
        expected_scheduled = set(scheduled)
        end = time.monotonic() + size.settle
        handled: dict[str, int] = {}
        # The orphan strangers forwarded start a group each: their queues wait for it (a loaded
        # machine's cold starts outlast the window below).
        cold = [protocol.request_queue(rpc.pool, f"stranger-{st.id}")
                for st in sender.sent if st.target == strangers.ORPHAN]
        bridged = [protocol.orphan_queue(rpc.pool), protocol.dl_queue(rpc.pool),
                   protocol.activity_queue(rpc.pool), *cold]

        def settled() -> bool:
            handled.update({k.decode(): int(v) for k, v in rpc.redis.hgetall(handled_key(rpc.pool)).items()})
            return expected_scheduled <= handled.keys() and delay.waiting() == 0 and rpc.queued(bridged) == 0

        wait_for(settled, max(0.0, end - time.monotonic()), interval=0.5, required=False)
        time.sleep(2.0)  # window: what the bridges still do with the last strangers
        seconds = time.monotonic() - start
        calls = rpc.account(scenario, traffic, seconds, len(sender.sent))
        return _settle(scenario, rpc, delay, sender, calls, scheduled, seconds, since)


def _settle(scenario: str, rpc: RpcRig, delay: DelayRig, sender: Strangers, calls: Account,
            scheduled: list[str], seconds: float, since: datetime) -> Account:
    """The calls' account with the scheduled calls added and the strangers' columns filled."""
    handled = {k.decode(): int(v) for k, v in rpc.redis.hgetall(handled_key(rpc.pool)).items()}
    forged_ids = {k.decode() for k in rpc.redis.hkeys(handled_key(rpc.pool, "forged"))}
    # A producer's own header, beside a checked user_id or without one: a worker believes it only
    # from its pool's orphans user (locally the same user as everyone's: only the first case).
    forged = Counter(st.target for st in sender.sent if st.id in forged_ids)
    rpc.redis.delete(handled_key(rpc.pool, "forged"), handled_key(rpc.pool, "shed"))
    sched = Account.settle(scenario, scheduled, handled, seconds)
    poisoned = poison_messages(rpc.settings.connections.amqp_url, protocol.poison_queue(rpc.pool))
    parked = parked_reasons(delay)
    assert delay.reader is not None
    fired = set(delay.reader.poll(1.0) and delay.reader.ids())
    dropped = {sender.positions[at] for at in _dropped(delay.node.log, delay.input) if at in sender.positions}
    activity_left = rpc.queued([protocol.activity_queue(rpc.pool)])
    fates: Counter[str] = Counter()
    lost: Counter[str] = Counter()
    for stranger in sender.sent:
        sid = stranger.id
        fate = ("poisoned" if poisoned.get(sid) else "parked" if parked.get(sid) else
                "dropped" if sid in dropped else "handled" if sid in handled else "fired" if sid in fired else
                "consumed" if stranger.target == strangers.ACTIVITY and not activity_left else "")
        if fate:
            fates[fate] += 1
        else:
            lost[f"{stranger.target}/{stranger.shape}"] += 1
    restarted = restarts(rpc.plane.log, delay.node.log)
    over = {name: n for name, n in restarted.items() if n > 1}
    counted = dict(counters([observability.pool_service(rpc.pool), observability.DELAY_SERVICE], since))
    counted["worker log lines"] = worker_poisoned(rpc.plane.log.parent / "workers")
    set_aside = fates["poisoned"] + fates["parked"] + fates["dropped"]
    uncounted = max(0, set_aside - sum(n for name, n in counted.items() if SET_ASIDE.search(name)) -
                    counted["worker log lines"])
    notes = [calls.note, f"strangers: {dict(fates)}", f"unaccounted: {dict(lost)}" if lost else "",
             f"forged x-switchyard-user-id at a handler: {dict(forged)}" if forged else "",
             f"set aside {set_aside}, counted {set_aside - uncounted}" if uncounted else "",
             f"restarted more than once: {over}" if over else "",
             f"restarted once: {sorted(set(restarted) - set(over))}" if len(restarted) > len(over) else "",
             f"counted: {counted}",
             f"refused by the broker: {dict(sender.refused)}" if sender.refused else ""]
    return replace(calls, sent=calls.sent + sched.sent, once=calls.once + sched.once,
                   duplicated=calls.duplicated + sched.duplicated, lost=calls.lost + sched.lost,
                   bad=len(sender.sent), bad_lost=sum(lost.values()) + sum(forged.values()) + uncounted,
                   restarted=len(over),
                   note="; ".join(filter(None, notes)))
