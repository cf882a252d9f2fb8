"""End-to-end benchmark of the delay scheduler through the broker: throughput and firing jitter.

For each offered rate, publishes Chronos messages with delays uniform in [3, 10] s for --duration
seconds to a fresh input topic, runs the scheduler as the local runtime (two processes: the MSK
bridge + enqueue handler, and the fire + sweep loops), reads the output topic, and reports:

* offered rate achieved, fired throughput in the steady window, lost / duplicated messages;
* fire jitter = output record CreateTime (stamped when the scheduler produced it) - deadline;
* arrival jitter = time this benchmark's consumer received it - deadline (includes the broker
  round trip and the reader's fetch latency);

p50 / p99 / p99.9 / max of each, the CPU each scheduler process used per message (load-independent),
the load average before and after each rate, and draws the fire-jitter distributions to a PNG.

Arrival jitter adds the scheduler producer's linger (up to 5 ms), the broker round trip and the
reader's fetch; the reader stamps a record when ``consume`` returns, which it does within 2 ms.
``--enqueue-procs N`` runs N enqueue processes in one consumer group (as N concurrent Lambda pollers
over a partitioned input topic would); one suffices for 10,000 msg/s since the COPY-based enqueue.

    .venv/bin/python bench/delay_bench.py --rates 1000 5000 10000 --duration 60

The timing advance defaults to 0 here so that fire jitter measures precision against the deadline
itself (set --advance-ms to see the effect of the seed's 50 ms default: everything shifts earlier).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from switchyard.config import Connections  # noqa: E402
from switchyard.delay.parsing import format_deadline  # noqa: E402
from switchyard.delay.store import PostgresDelayStore  # noqa: E402

PAD = b"x" * 64


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 / p99 / p99.9 / max (nearest rank) of a list, in the list's unit."""
    if not values:
        return {}
    s = sorted(values)

    def rank(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))]

    return {"p50": rank(50), "p99": rank(99), "p99.9": rank(99.9), "max": s[-1], "min": s[0]}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process (all its threads) has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_output(bootstrap: str, topic: str, partitions: int, expected: int, idle_s: float, out: str) -> None:
    """Child process: read the output topic until ``expected`` messages or ``idle_s`` without any."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 5, "fetch.min.bytes": 65536})
    consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
    rows: list[tuple[str, int, int, float]] = []
    last = time.time()
    while len(rows) < expected and time.time() - last < idle_s:
        # consume() returns at 1000 records or at the timeout: a short one, so the stamp is close to
        # the record's arrival (0.1 s made arrival look ~60 ms late at 1,000 msg/s).
        for msg in consumer.consume(1000, 0.002):
            if msg.error() is not None:
                continue
            now = time.time() * 1000
            deadline_ms, message_id = msg.value().split(b"|", 2)[:2]
            rows.append((message_id.decode(), int(deadline_ms), msg.timestamp()[1], now))
            last = time.time()
    consumer.close()
    Path(out).write_text(json.dumps(rows))


def run_rate(rate: int, args: argparse.Namespace, conn: Connections, workdir: Path) -> dict:
    load_before = [round(x, 2) for x in os.getloadavg()]
    name = f"bench_{rate}_{uuid.uuid4().hex[:6]}"
    in_topic, out_topic = f"{name}-in", f"{name}-out"
    admin = AdminClient({"bootstrap.servers": conn.kafka_bootstrap})
    for f in admin.create_topics([NewTopic(in_topic, args.partitions, 1),
                                  NewTopic(out_topic, args.partitions, 1)]).values():
        f.result(15)
    env = dict(os.environ, PYTHONPATH=str(ROOT), POWERTOOLS_METRICS_DISABLED="true",
               SWITCHYARD_LOG_LEVEL="WARNING", SWITCHYARD_DELAY_SCHEMA=name,
               SWITCHYARD_DELAY_INPUT_TOPIC=in_topic, SWITCHYARD_DELAY_OUTPUT_TOPIC=out_topic,
               SWITCHYARD_DELAY_CONSUMER_GROUP=f"{name}-g", SWITCHYARD_DELAY_APPLICATION_NAME=name,
               SWITCHYARD_DELAY_TIMING_ADVANCE_MS=str(args.advance_ms),
               SWITCHYARD_DELAY_BATCH_SIZE=str(args.batch_size))
    subprocess.run([sys.executable, "-m", "switchyard", "delay", "migrate"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    roles_per_proc = [["enqueue"]] * args.enqueue_procs + [["fire", "sweep"]]
    logs = [open(workdir / f"{name}-{i}.log", "wb") for i in range(len(roles_per_proc))]  # noqa: SIM115
    procs = [subprocess.Popen([sys.executable, "-m", "switchyard", "delay", "run", "--roles", *roles],
                              env=env, stdout=logs[i], stderr=subprocess.STDOUT)
             for i, roles in enumerate(roles_per_proc)]
    expected = rate * args.duration
    result_file = workdir / f"{name}.json"
    reader = mp.Process(target=read_output, args=(conn.kafka_bootstrap, out_topic, args.partitions,
                                                  expected, 15.0 + args.max_delay, str(result_file)))
    reader.start()
    time.sleep(3.0)  # group join of the bridge, producers connected
    cpu0 = [cpu_seconds(p.pid) for p in procs]

    producer = Producer({"bootstrap.servers": conn.kafka_bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
    rnd = random.Random(rate)
    start = time.time()
    sent = 0
    tick = 0.01
    while True:
        elapsed = time.time() - start
        if elapsed >= args.duration:
            break
        target = min(expected, int((elapsed + tick) * rate))
        while sent < target:
            deadline = datetime.now(UTC).timestamp() + rnd.uniform(args.min_delay, args.max_delay)
            deadline_ms = int(deadline * 1000)
            message_id = f"{rate}-{sent}"
            deadline_text = format_deadline(datetime.fromtimestamp(deadline_ms / 1000, UTC)).encode()
            producer.produce(in_topic, key=str(sent % 1000).encode(),
                             value=b"%d|%s|" % (deadline_ms, message_id.encode()) + PAD,
                             headers=[("chronosMessageId", message_id.encode()),
                                      ("chronosDeadline", deadline_text)])
            sent += 1
        producer.poll(0)
        time.sleep(max(0.0, start + (target / rate) - time.time()))
    offered_s = time.time() - start
    producer.flush(30)
    reader.join(args.max_delay + 120)
    cpu1 = [cpu_seconds(p.pid) for p in procs]
    load_after = os.getloadavg()
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    for log in logs:
        log.close()
    rows = json.loads(result_file.read_text()) if result_file.exists() else []
    store = PostgresDelayStore(conn.postgres_dsn, name)
    left = store.counts()
    store.drop_schema()
    store.close()
    admin.delete_topics([in_topic, out_topic])

    ids = [r[0] for r in rows]
    unique = set(ids)
    fire = [r[2] - r[1] for r in rows]
    arrival = [r[3] - r[1] for r in rows]
    fire_times = sorted(r[2] / 1000 for r in rows)
    # Steady window: from the time the longest delay first fires to the end of the offered load.
    w0, w1 = start + args.max_delay, start + args.duration
    in_window = sum(1 for t in fire_times if w0 <= t < w1)
    return {
        "rate_offered": rate, "duration_s": args.duration, "sent": sent,
        "rate_achieved": round(sent / offered_s, 1),
        "received": len(rows), "unique": len(unique), "duplicates": len(rows) - len(unique),
        "lost": sent - len(unique), "rows_left_in_db": left,
        "fired_per_s_steady": round(in_window / (w1 - w0), 1) if w1 > w0 else None,
        # CPU per message of each scheduler process over the run: independent of the machine's load.
        "cpu_us_per_msg": {"+".join(r) + f"#{i}": round((b - a) / max(1, sent) * 1e6, 1)
                           for i, (r, a, b) in enumerate(zip(roles_per_proc, cpu0, cpu1, strict=True))},
        "load_avg_before": load_before, "load_avg_after": [round(x, 2) for x in load_after],
        "fire_jitter_ms": {k: round(v, 2) for k, v in percentiles(fire).items()},
        "arrival_jitter_ms": {k: round(v, 2) for k, v in percentiles(arrival).items()},
        "fire_jitter_samples": fire,
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (hist, cdf) = plt.subplots(1, 2, figsize=(13, 5))
    for r in results:
        samples = sorted(r["fire_jitter_samples"])
        if not samples:
            continue
        label = f"{r['rate_offered']:,} msg/s (p99.9 {r['fire_jitter_ms']['p99.9']} ms)"
        hist.hist(samples, bins=200, histtype="step", log=True, label=label)
        tail = [1 - (i + 0.5) / len(samples) for i in range(len(samples))]
        cdf.plot(samples, tail, label=label)
    hist.set(xlabel="fire time - deadline (ms)", ylabel="messages (log)", title="Fire jitter distribution")
    cdf.set(xlabel="fire time - deadline (ms)", ylabel="fraction later than x (log)", yscale="log",
            xscale="symlog", title="Jitter tail (complementary CDF)")
    for ax in (hist, cdf):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle("Switchyard delay scheduler, end to end through tansu + Postgres, 2 cores, delays 3-10 s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--duration", type=int, default=60, help="seconds of offered load per rate")
    parser.add_argument("--min-delay", type=float, default=3.0)
    parser.add_argument("--max-delay", type=float, default=10.0)
    parser.add_argument("--advance-ms", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--enqueue-procs", type=int, default=1,
                        help="enqueue processes (MSK bridge + handler) in one consumer group")
    parser.add_argument("--batch-size", type=int, default=1000, help="the MSK mapping's batch size")
    parser.add_argument("--out", default=str(ROOT / "bench" / "delay_results.json"))
    parser.add_argument("--plot", default=str(ROOT / "bench" / "delay_jitter.png"))
    args = parser.parse_args()
    conn = Connections.from_env()
    workdir = ROOT / "bench" / "results"
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for rate in args.rates:
        r = run_rate(rate, args, conn, workdir)
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "fire_jitter_samples"}), flush=True)
    plot(results, Path(args.plot))
    Path(args.out).write_text(json.dumps(
        {"load1_before_after": os.getloadavg(), "args": vars(args),
         "results": [{k: v for k, v in r.items() if k != "fire_jitter_samples"} for r in results]}, indent=2))
    print(f"plot: {args.plot}\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
