"""End-to-end benchmark of the delay scheduler through the broker, with its peers in the same run.

For each offered rate, publishes Chronos messages with delays uniform in [min, max] s for --duration
seconds to a fresh input topic, runs the scheduler as the local runtime (processes: the MSK bridge +
enqueue handler, and the fire + sweep loops), reads the output topic, and reports:

* offered rate achieved, fired throughput in the steady window, lost / duplicated messages;
* fire jitter = output record CreateTime (stamped when the scheduler produced it) - deadline;
* arrival jitter = time this benchmark's reader received it - deadline: adds the producer's linger
  (5 ms), the broker and the reader's fetch. The reader uses the consumer settings docs/delay.md
  recommends to applications (switchyard.delay.settings.OUTPUT_CONSUMER_SETTINGS) and stamps a
  record when ``poll`` returns it (no batch wait);
* CPU per second and per message of each scheduler process, of the broker (tansu) and of the
  scheduler's Postgres backends, with the load average before and after. Rate 0 measures a
  scheduler with nothing to do (its idle cost).

``--busy`` runs everything with the other core busy: a fixed CPU load (one spinning process) pinned
to core 1 with taskset, started before the first rate and stopped after the last, so busy figures
can be repeated. ``--peers arq procrastinate`` runs the peers (bench/peers/run_peer.py, in their own
virtual environment, bench/peers/setup.sh) at the same offered rates right after Switchyard, and
prints one table with ratios measured in this run. ``--profile`` records the scheduler processes at the
highest rate with py-spy (from that environment) and prints the top lines of each.

    .venv/bin/python bench/delay_bench.py --rates 0 100 1000 10000 --duration 60 --peers arq procrastinate

The timing advance defaults to 0 here so that fire jitter measures precision against the deadline
itself (set --advance-ms to see the effect of the seed's 50 ms default: everything shifts earlier).
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.stats import BUSY_CORE, busy_load, cpu_seconds, listener_pid, load_average, percentiles  # noqa: E402
from switchyard.core.config import Connections  # noqa: E402
from switchyard.delay.parsing import format_deadline  # noqa: E402
from switchyard.delay.settings import OUTPUT_CONSUMER_SETTINGS  # noqa: E402
from switchyard.delay.store import PostgresDelayStore  # noqa: E402

PAD = b"x" * 64
PEERS_VENV = Path(os.environ.get("PEERS_VENV", ROOT / ".local" / "peers-venv"))


def read_output(bootstrap: str, topic: str, partitions: int, expected: int, idle_s: float, out: str) -> None:
    """Child process: read the output topic until ``expected`` messages or ``idle_s`` without any."""
    consumer = Consumer({**OUTPUT_CONSUMER_SETTINGS, "bootstrap.servers": bootstrap,
                         "group.id": f"bench-{uuid.uuid4()}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
    rows: list[tuple[str, int, int, float]] = []
    last = time.time()
    while len(rows) < expected and time.time() - last < idle_s:
        # poll() returns at the first record (consume() would wait for its batch or its timeout);
        # what else is already fetched comes with consume(n, 0), stamped at the same moment.
        first = consumer.poll(0.1)
        if first is None:
            continue
        now = time.time() * 1000
        for msg in [first, *consumer.consume(1000, 0)]:
            if msg.error() is not None:
                continue
            deadline_ms, message_id = msg.value().split(b"|", 2)[:2]
            rows.append((message_id.decode(), int(deadline_ms), msg.timestamp()[1], now))
        last = time.time()
    consumer.close()
    Path(out).write_text(json.dumps(rows))


def wait_started(logs: list[Path], timeout_s: float) -> None:
    """Until every scheduler process said it runs (imports take seconds on a loaded machine)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not all(b"switchyard delay: running" in p.read_bytes() for p in logs):
        time.sleep(0.2)


def backend_pids(dsn: str, application_name: str) -> list[int]:
    """The scheduler's Postgres server processes (same host): their CPU is part of its cost."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                           (application_name,))]


class CpuMeter:
    """CPU seconds of named process groups between two readings; pids may be added (backends appear)."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self.start: dict[int, float] = {}
        self.end: dict[int, float] = {}

    def add(self, name: str, pids: list[int]) -> None:
        """Processes started after ``begin``: all their CPU was used within the measurement."""
        for pid in pids:
            if pid not in self.groups.setdefault(name, []):
                self.groups[name].append(pid)
                self.start[pid] = 0.0

    def begin(self) -> None:
        self.start = {pid: cpu_seconds(pid) for pids in self.groups.values() for pid in pids}
        self.began = time.monotonic()

    def finish(self) -> None:
        self.end = {pid: cpu_seconds(pid) for pids in self.groups.values() for pid in pids}
        self.seconds = time.monotonic() - self.began

    def used(self, name: str) -> float:
        return sum(self.end[p] - self.start[p] for p in self.groups[name]
                   if p in self.end and self.end[p] == self.end[p])  # NaN: the process ended


def profile(pid: int, seconds: float, out: Path, delay_s: float = 0.0) -> list[str]:
    """py-spy (peers environment) on one process after ``delay_s``; the top functions by own and by
    inclusive samples."""
    spy = PEERS_VENV / "bin" / "py-spy"
    if not spy.exists():
        return [f"no py-spy at {spy}: run bench/peers/setup.sh"]
    time.sleep(delay_s)  # into the steady state, where rows fire as fast as they come
    subprocess.run([str(spy), "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100", "-f", "raw",
                    "-o", str(out)], capture_output=True, timeout=seconds + 60)
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in out.read_text().splitlines() if out.exists() else []:
        stack, _, n = line.rpartition(" ")
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames or not n.isdigit():
            continue
        total += int(n)
        own[frames[-1]] += int(n)
        for f in set(frames):
            incl[f] += int(n)
    lines = [f"py-spy: {total} samples of pid {pid} over {seconds:.0f} s (raw: {out})"]
    lines += [f"  own  {n / total:6.1%}  {f}" for f, n in own.most_common(12)] if total else []
    lines += [f"  incl {n / total:6.1%}  {f}" for f, n in incl.most_common(25)] if total else []
    return lines


def offer(producer: Producer, topic: str, rate: int, duration: float, delays: tuple[float, float],
          ) -> tuple[int, float]:
    """Publish Chronos messages at ``rate`` for ``duration`` s; returns (sent, start time)."""
    rnd = random.Random(rate)
    start = time.time()
    sent, tick, expected = 0, 0.01, int(rate * duration)
    while rate and (elapsed := time.time() - start) < duration:
        target = min(expected, int((elapsed + tick) * rate))
        while sent < target:
            deadline_ms = int((time.time() + rnd.uniform(*delays)) * 1000)
            message_id = f"{rate}-{sent}"
            deadline_text = format_deadline(datetime.fromtimestamp(deadline_ms / 1000, UTC)).encode()
            producer.produce(topic, key=str(sent % 1000).encode(),
                             value=b"%d|%s|" % (deadline_ms, message_id.encode()) + PAD,
                             headers=[("chronosMessageId", message_id.encode()),
                                      ("chronosDeadline", deadline_text)])
            sent += 1
        producer.poll(0)
        time.sleep(max(0.0, start + (target / rate) - time.time()))
    if not rate:
        time.sleep(duration)
    producer.flush(30)
    return sent, start


def work_dir(out: Path) -> Path:
    """Where a run's per-rate logs and samples go (a few MB per rate): beside ``--out``, named after
    it (``dir/x.json`` -> ``dir/results/x/``; the default is git-ignored), so a run writes only where
    it was told."""
    return out.parent / "results" / out.stem


def run_rate(rate: int, args: argparse.Namespace, conn: Connections, workdir: Path) -> dict:
    load_before = load_average()
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
    expected = int(rate * args.duration)
    result_file = workdir / f"{name}.json"
    reader = mp.Process(target=read_output, args=(conn.kafka_bootstrap, out_topic, args.partitions,
                                                  expected, 15.0 + args.max_delay, str(result_file)))
    if rate:
        reader.start()
    wait_started([workdir / f"{name}-{i}.log" for i in range(len(procs))], timeout_s=60)
    time.sleep(3.0)  # the bridge joins its group, producers connect
    groups = {"+".join(r) + f"#{i}": [p.pid]
              for i, (r, p) in enumerate(zip(roles_per_proc, procs, strict=True))}
    broker = listener_pid(int(conn.kafka_bootstrap.rsplit(":", 1)[1]))
    meter = CpuMeter({**groups, "postgres": backend_pids(conn.postgres_dsn, name),
                      "tansu": [broker] if broker else []})
    meter.begin()
    producer = Producer({"bootstrap.servers": conn.kafka_bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
    profile_lines: list[str] = []
    if args.profile and rate == max(args.rates):
        spy_after = min(args.max_delay + 1, args.duration / 2)
        spies = [ThreadPoolExecutor(1).submit(profile, p.pid, max(5.0, args.duration - spy_after),
                                              workdir / f"{name}-{i}.pyspy.txt", delay_s=spy_after)
                 for i, p in enumerate(procs)]
    sent, start = offer(producer, in_topic, rate, args.duration, (args.min_delay, args.max_delay))
    offered_s = time.time() - start
    meter.add("postgres", backend_pids(conn.postgres_dsn, name))  # the store worker's, made after start
    if rate:
        reader.join(args.max_delay + 120)
    meter.finish()
    load_after = load_average()
    if args.profile and rate == max(args.rates):
        profile_lines = [line for spy in spies for line in spy.result(timeout=120)]
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

    unique = {r[0] for r in rows}
    fire = [r[2] - r[1] for r in rows]
    arrival = [r[3] - r[1] for r in rows]
    # Steady window: from the time the longest delay first fires to the end of the offered load.
    w0, w1 = start + args.max_delay, start + args.duration
    in_window = sum(1 for r in rows if w0 <= r[2] / 1000 < w1)
    cpu_s = {g: meter.used(g) for g in meter.groups}
    return {
        "system": "switchyard", "mode": "busy" if args.busy else "quiet",
        "rate_offered": rate, "duration_s": args.duration, "sent": sent,
        "rate_achieved": round(sent / offered_s, 1),
        "received": len(rows), "unique": len(unique), "duplicates": len(rows) - len(unique),
        "lost": sent - len(unique), "rows_left_in_db": left,
        "fired_per_s_steady": round(in_window / (w1 - w0), 1) if w1 > w0 and rate else None,
        # CPU of each process group over the run: per second (the idle cost at rate 0), per message.
        "cpu_core_fraction": {g: round(v / meter.seconds, 4) for g, v in cpu_s.items()},
        "cpu_us_per_msg": {g: round(v / max(1, sent) * 1e6, 1) for g, v in cpu_s.items()} if sent else None,
        "load_avg_before": load_before, "load_avg_after": load_after,
        "fire_jitter_ms": {k: round(v, 2) for k, v in percentiles(fire).items()},
        "arrival_jitter_ms": {k: round(v, 2) for k, v in percentiles(arrival).items()},
        "fire_jitter_samples": fire, "profile": profile_lines,
    }


def run_peer(peer: str, rate: int, args: argparse.Namespace) -> dict:
    """One peer at one rate, in its own environment; its summary (or the error it ended with)."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        return {"system": peer, "rate_offered": rate, "error": f"no {python}: run bench/peers/setup.sh"}
    cmd = [str(python), str(ROOT / "bench" / "peers" / "run_peer.py"), peer, "--rate", str(rate),
           "--duration", str(args.duration), "--min-delay", str(args.min_delay),
           "--max-delay", str(args.max_delay), "--poll-s", str(args.peer_poll_s)]
    # Its own session, so that a peer that overruns is stopped with its worker (a grandchild).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=args.duration + args.max_delay + 240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"system": peer, "rate_offered": rate, "error": "overran its time; stopped"}
    lines = stdout.strip().splitlines()
    if proc.returncode or not lines:
        return {"system": peer, "rate_offered": rate, "error": stderr.strip()[-500:]}
    return {**json.loads(lines[-1]), "mode": "busy" if args.busy else "quiet"}


def table(results: list[dict]) -> list[str]:
    """One row per system and rate; ratios to Switchyard's row at the same rate, from this run."""
    ours = {r["rate_offered"]: r for r in results if r["system"] == "switchyard"}
    head = (f"{'system':14} {'offered/s':>9} {'sustained/s':>11} {'late p50':>9} {'p99':>8} "
            f"{'p99.9':>8} {'lost/left':>9} {'dups':>5} {'CPU us/job':>10} {'server us/job':>13} "
            f"{'sustained x':>11} {'p99.9 x':>8}")
    lines = [head, "-" * len(head)]
    for r in sorted(results, key=lambda r: (r["rate_offered"], r["system"] != "switchyard", r["system"])):
        rate = r["rate_offered"]
        if not rate:
            continue
        if "error" in r:
            lines.append(f"{r['system']:14} {rate:>9,} error: {r['error'][:80]}")
            continue
        if r["system"] == "switchyard":
            late, sustained = r["arrival_jitter_ms"], r["fired_per_s_steady"]
            cpu = sum(v for g, v in (r["cpu_us_per_msg"] or {}).items() if "#" in g)
            server = sum(v for g, v in (r["cpu_us_per_msg"] or {}).items() if "#" not in g)
        else:
            late, sustained = r["lateness_ms"], r["sustained_per_s"]
            cpu, server = r["cpu_us_per_job"], r.get("server_cpu_us_per_job") or 0
        base = ours.get(rate)
        ratio = base and base["fired_per_s_steady"] and sustained is not None
        sus_x = f"{sustained / base['fired_per_s_steady']:.2f}" if ratio else "-"
        p999_x = (f"{late.get('p99.9', 0) / max(1, base['arrival_jitter_ms'].get('p99.9', 0)):.2f}"
                  if base and late and base["arrival_jitter_ms"] else "-")
        lines.append(f"{r['system']:14} {rate:>9,} {sustained or 0:>11,.0f} {late.get('p50', 0):>9,.0f} "
                     f"{late.get('p99', 0):>8,.0f} {late.get('p99.9', 0):>8,.0f} {r['lost']:>9} "
                     f"{r['duplicates']:>5} {cpu:>10,.0f} {server:>13,.0f} {sus_x:>11} {p999_x:>8}")
    return lines


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
    parser.add_argument("--rates", type=int, nargs="+", default=[0, 100, 1000, 10000],
                        help="offered rates; 0 measures a scheduler with nothing to do")
    parser.add_argument("--duration", type=int, default=60, help="seconds of offered load per rate")
    parser.add_argument("--min-delay", type=float, default=3.0)
    parser.add_argument("--max-delay", type=float, default=10.0)
    parser.add_argument("--advance-ms", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--enqueue-procs", type=int, default=1,
                        help="enqueue processes (MSK bridge + handler) in one consumer group")
    parser.add_argument("--batch-size", type=int, default=1000, help="the MSK mapping's batch size")
    parser.add_argument("--busy", action="store_true", help=f"a spinning process pinned to core {BUSY_CORE}")
    parser.add_argument("--peers", nargs="*", default=[], choices=["arq", "procrastinate"])
    parser.add_argument("--peer-poll-s", type=float, default=0.01, help="the peers' worker poll interval")
    parser.add_argument("--profile", action="store_true", help="py-spy the scheduler at the top rate")
    parser.add_argument("--out", default=str(ROOT / "bench" / "delay_results.json"),
                        help="the results JSON; per-rate logs and samples go to a directory beside it "
                             "(dir/x.json -> dir/results/x/)")
    parser.add_argument("--plot", default=None,
                        help="the jitter plot (default: delay_jitter.png beside --out)")
    args = parser.parse_args()
    args.plot = args.plot or str(Path(args.out).parent / "delay_jitter.png")
    conn = Connections.from_env()
    workdir = work_dir(Path(args.out))
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    spinner = busy_load(args.busy)
    try:
        for rate in args.rates:
            r = run_rate(rate, args, conn, workdir)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k not in ("fire_jitter_samples", "profile")}),
                  flush=True)
            print("\n".join(r["profile"]), flush=True)
            for peer in args.peers if rate else ():
                results.append(run_peer(peer, rate, args))
                print(json.dumps(results[-1]), flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    plot([r for r in results if r["system"] == "switchyard"], Path(args.plot))
    print(f"\n{'busy' if args.busy else 'quiet'}: lateness is arrival - deadline for Switchyard (through "
          "the broker), run - due for the peers; ratios are to Switchyard in this run; load average "
          f"{load_average()}")
    print("\n".join(table(results)))
    Path(args.out).write_text(json.dumps(
        {"load1_before_after": os.getloadavg(), "args": vars(args),
         "results": [{k: v for k, v in r.items() if k != "fire_jitter_samples"} for r in results]}, indent=2))
    print(f"plot: {args.plot}\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
