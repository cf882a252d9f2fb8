"""Scheduled calls end to end: how late a call starts on its worker, beside the delay scheduler's own
lateness in the same run.

Runs the whole loop locally as it is deployed: ``switchyard delay run`` (enqueue bridge, fire and
sweep loops), the scheduled-call relay on the output topic (``switchyard delay run --roles
scheduled``) and ``switchyard local`` (the pool's control plane, whose subprocess driver starts the
workers) as processes of their own, on a fresh
pool, topics and schema. For each offered rate, schedules calls with ``RpcClient.schedule`` for
--duration seconds, deadlines uniform in [--min-delay, --max-delay] s ahead, over --keys keys whose
groups were started before (a cold start is not lateness); answers go to a durable reply queue.

* worker lateness = the time the worker's handler started (its clock, stamped in its answer) minus
  the call's deadline: the scheduler, the output topic, the relay, RabbitMQ and the worker;
* fire lateness = the output record's CreateTime (stamped when the scheduler produced it) minus the
  deadline: the delay scheduler's own, read from the output topic in the same run;
* the hop = worker lateness minus fire lateness, per call.

    .venv/bin/python bench/scheduled_bench.py --rates 100 1000 --duration 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pika
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.stats import load_average, percentiles  # noqa: E402
from switchyard.core.config import Connections  # noqa: E402
from switchyard.delay.settings import OUTPUT_CONSUMER_SETTINGS  # noqa: E402
from switchyard.delay.store import PostgresDelayStore  # noqa: E402
from switchyard.rpc import RpcClient, protocol  # noqa: E402
from switchyard.rpc.client.schedule import declare_reply_queue  # noqa: E402
from switchyard.rpc.control.topology import PoolTopology  # noqa: E402
from switchyard.rpc.settings import RpcSettings  # noqa: E402
from switchyard.rpc.worker import Request  # noqa: E402


def stamp(request: Request) -> str:
    """The workers' handler: the call's deadline (its body) and when this handler started, in ms."""
    return f"{request.text()} {time.time() * 1000:.3f}"


class Answers:
    """Consumes the reply queue: call id -> (deadline ms, worker start ms); counts duplicates."""

    def __init__(self, settings: RpcSettings, queue: str) -> None:
        self.found: dict[str, tuple[float, float]] = {}
        self.duplicates = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(settings, queue), daemon=True)
        self._thread.start()

    def _run(self, settings: RpcSettings, queue: str) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
        channel = connection.channel()

        def on_message(_ch: object, _method: object, props: pika.BasicProperties, body: bytes) -> None:
            due, started = body.split()
            if props.correlation_id in self.found:
                self.duplicates += 1
            self.found[str(props.correlation_id)] = (float(due), float(started))

        channel.basic_consume(queue, on_message, auto_ack=True)
        while not self._stop.is_set():
            connection.process_data_events(time_limit=0.1)
        connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class Fired:
    """Reads the output topic: call id (the record's x-switchyard-id) -> CreateTime minus deadline."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.late: dict[str, float] = {}
        self._stop = threading.Event()
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                                   "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                   **OUTPUT_CONSUMER_SETTINGS})
        # assigned, not subscribed: no group join to wait for (the topics have 2 partitions)
        self._consumer.assign([TopicPartition(topic, n, OFFSET_BEGINNING) for n in range(2)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            headers = dict(msg.headers() or [])
            call_id = (headers.get(protocol.ID_HEADER) or b"").decode()
            self.late[call_id] = msg.timestamp()[1] - float(msg.value() or b"0")
        self._consumer.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "switchyard", *command], env=env, cwd=ROOT,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def run_rate(client: RpcClient, reply: str, keys: list[str], rate: int, duration: float,
             delays: tuple[float, float], answers: Answers, fired: Fired, drain_s: float) -> dict:
    ids: list[str] = []
    futures = []
    interval, t0 = 1.0 / rate, time.monotonic()
    for n in range(int(rate * duration)):
        pause = t0 + n * interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        delay = random.uniform(*delays)
        due_ms = (time.time() + delay) * 1000
        ids.append(uuid.uuid4().hex)
        futures.append(client.schedule(keys[n % len(keys)], f"{due_ms:.3f}", at=delay, reply=reply,
                                       call_id=ids[-1]))
    offered = len(ids) / (time.monotonic() - t0)
    for future in futures:
        future.result(30)
    end = time.monotonic() + delays[1] + drain_s
    while time.monotonic() < end and not all(i in answers.found for i in ids):
        time.sleep(0.2)
    worker = [answers.found[i][1] - answers.found[i][0] for i in ids if i in answers.found]
    fire = [fired.late[i] for i in ids if i in fired.late]
    hop = [answers.found[i][1] - answers.found[i][0] - fired.late[i] for i in ids
           if i in answers.found and i in fired.late]
    rounded = {name: {k: round(v, 1) for k, v in percentiles(values).items()}
               for name, values in (("worker_lateness_ms", worker), ("fire_lateness_ms", fire),
                                    ("hop_ms", hop))}
    return {"rate": rate, "offered_per_s": round(offered), "scheduled": len(ids), "answered": len(worker),
            "lost": len(ids) - len(worker),
            "duplicates": answers.duplicates, **rounded}


def environment(tag: str, workers: int) -> dict[str, str]:
    """The processes' environment: this run's topics, schema and consumer group, the workers' handler."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path,
            "SWITCHYARD_DELAY_INPUT_TOPIC": f"sbench-{tag}-in",
            "SWITCHYARD_DELAY_OUTPUT_TOPIC": f"sbench-{tag}-out",
            "SWITCHYARD_DELAY_SCHEMA": f"sbench_{tag}", "SWITCHYARD_DELAY_CONSUMER_GROUP": f"sbench-{tag}",
            "SWITCHYARD_DELAY_TIMING_ADVANCE_MS": "0",  # lateness against the deadline itself
            "SWITCHYARD_RPC_DRIVER": "subprocess",
            "SWITCHYARD_RPC_WORKER_HANDLER": "bench.scheduled_bench:stamp",
            "SWITCHYARD_RPC_MIN_WORKERS": str(workers), "SWITCHYARD_RPC_MAX_WORKERS": str(workers),
            "SWITCHYARD_LOG_LEVEL": "WARNING", "POWERTOOLS_METRICS_DISABLED": "true"}


def measure(args: argparse.Namespace, pool: str, reply: str, env: dict[str, str], logs: Path) -> list[dict]:
    """Start the scheduler and the control plane, start the groups, then each rate in turn."""
    settings = RpcSettings.from_env()
    # The relay in a process of its own, as it is a function of its own on AWS (one process would
    # share one interpreter lock between it, the enqueue bridge and the fire loop).
    procs = [start(["delay", "run", "--roles", "enqueue", "fire", "sweep"], env, logs / "delay.log"),
             start(["delay", "run", "--roles", "scheduled"], env, logs / "relay.log"),
             start(["local", "--pool", pool], env, logs / "local.log")]
    answers = Answers(settings, protocol.reply_queue(reply))
    fired = Fired(Connections.from_env().kafka_bootstrap, env["SWITCHYARD_DELAY_OUTPUT_TOPIC"])
    results = []
    try:
        keys = [f"k{n}" for n in range(args.keys)]
        with RpcClient(pool, settings) as client:
            warm = [client.schedule(key, "0", at=0, reply=reply).result(60) for key in keys]
            end = time.monotonic() + 120
            while not all(i in answers.found for i in warm) and time.monotonic() < end:
                time.sleep(0.2)
            if not all(i in answers.found for i in warm):
                raise SystemExit(f"the groups did not answer their first call; logs in {logs}")
            for rate in args.rates:
                results.append(run_rate(client, reply, keys, rate, args.duration,
                                        (args.min_delay, args.max_delay), answers, fired, args.drain))
    finally:
        answers.close()
        fired.close()
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[100, 1000],
                        help="calls scheduled per second")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of scheduling per rate")
    parser.add_argument("--min-delay", type=float, default=2.0, help="shortest delay, s")
    parser.add_argument("--max-delay", type=float, default=4.0, help="longest delay, s")
    parser.add_argument("--keys", type=int, default=4, help="keys (worker groups) the calls go to")
    parser.add_argument("--workers", type=int, default=2, help="workers per group")
    parser.add_argument("--drain", type=float, default=20.0, help="seconds to wait for the last answers")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()

    tag = uuid.uuid4().hex[:8]
    pool = reply = f"sbench_{tag}"
    env = environment(tag, args.workers)
    os.environ["SWITCHYARD_DELAY_INPUT_TOPIC"] = env["SWITCHYARD_DELAY_INPUT_TOPIC"]  # the client's topic
    connections, settings = Connections.from_env(), RpcSettings.from_env()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"scheduled-bench-{tag}"
    logs.mkdir(parents=True)
    topics = [env["SWITCHYARD_DELAY_INPUT_TOPIC"], env["SWITCHYARD_DELAY_OUTPUT_TOPIC"]]
    admin = AdminClient({"bootstrap.servers": connections.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(t, num_partitions=2, replication_factor=1)
                                       for t in topics]).values():
        future.result(15)
    with PoolTopology(pool, settings) as topology:
        topology.declare()
    declare_reply_queue(settings, reply)
    load_before = load_average()
    try:
        results = measure(args, pool, reply, env, logs)
    finally:
        with PoolTopology(pool, settings) as topology:
            topology.delete(force=True)
        connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
        connection.channel().queue_delete(protocol.reply_queue(reply))
        connection.close()
        PostgresDelayStore(connections.postgres_dsn, env["SWITCHYARD_DELAY_SCHEMA"]).drop_schema()
        for future in admin.delete_topics(topics).values():
            future.result(15)
    report = {"load_before": load_before, "load_after": load_average(), "results": results}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"load average before {report['load_before']}, after {report['load_after']}")
        for r in results:
            print(f"{r['rate']:>5}/s (offered {r['offered_per_s']}/s): {r['answered']}/{r['scheduled']} "
                  f"answered, lost {r['lost']}, "
                  f"duplicates {r['duplicates']}")
            for name in ("worker_lateness_ms", "fire_lateness_ms", "hop_ms"):
                print(f"    {name:<20} {r[name]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
