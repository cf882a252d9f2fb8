"""``switchyard demo``: the main job on the local stack, with a summary a person can read.

A fresh pool with its control plane running locally (the Lambda handlers behind RabbitMQ
event-source bridges, the reconciler ticking, workers as subprocesses). Calls go to keys that
have no workers; groups start by themselves, traffic flows, a handler error comes back as a
negative response, a request stuck behind a slow worker comes back ``expired``, and once idle the
groups unbind and stop. Everything it created is deleted at the end (unless ``--keep``).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import Future

from switchyard.cli.options import add_stack_option
from switchyard.core.latency import LatencySummary

KEYS = ("infra=42", "infra=7", "🚂 express", "timetable #12", "infra=99", "infra=3")


class Printer:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def section(self, title: str) -> None:
        print(f"\n{title}", flush=True)

    def line(self, text: str) -> None:
        print(f"  {text}", flush=True)


class StateWatcher:
    """Records each group's transitions (active, unbound, running, stopped) as they happen."""

    def __init__(self, runtime, pool: str) -> None:
        self.runtime = runtime
        self.pool = pool
        self.events: list[tuple[float, str, str]] = []
        self._seen: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="demo-watcher")

    def start(self) -> StateWatcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            groups = self.runtime.plane.state.groups()
            running = self.runtime.driver.list_running(self.pool)
            for key in set(groups) | set(self._seen) | running:
                group = groups.get(key)
                workers = "workers up" if key in running else "no workers"
                status = f"{group.status.value}, {workers}" if group else "stopped, queue deleted"
                if self._seen.get(key) != status:
                    self._seen[key] = status
                    self.events.append((time.monotonic(), key, status))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def current(self) -> dict[str, str]:
        return dict(self._seen)


def _pipelined(client, keys: list[str], seconds: float, concurrency: int):
    """Keep ``concurrency`` calls in flight over ``keys`` for ``seconds``; returns per-call results."""
    latencies: dict[str, list[float]] = defaultdict(list)
    statuses: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    done = threading.Event()
    lock = threading.Lock()
    in_flight = [0]
    counter = [0]

    def launch() -> None:
        with lock:
            if time.monotonic() >= deadline:
                if in_flight[0] == 0:
                    done.set()
                return
            counter[0] += 1
            n = counter[0]
            in_flight[0] += 1
        key = keys[n % len(keys)]
        sent = time.perf_counter()
        future = client.submit(key, f"call {n}", timeout=10)
        future.add_done_callback(lambda f, key=key, sent=sent: finish(f, key, sent))

    def finish(future: Future, key: str, sent: float) -> None:
        elapsed = time.perf_counter() - sent
        error = future.exception()
        with lock:
            in_flight[0] -= 1
            if error is not None:
                failures[type(error).__name__] += 1
            else:
                statuses[future.result().status] += 1
                latencies[key].append(elapsed)
        launch()

    for _ in range(concurrency):
        launch()
    done.wait(seconds + 30)
    return latencies, statuses, failures


def run_demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    from switchyard.core.observability import logger

    if not args.verbose:
        logger.setLevel("ERROR")
    from switchyard.core.redis_client import connect_redis
    from switchyard.local.rpc_runtime import LocalControlPlane
    from switchyard.rpc.amqp import redact
    from switchyard.rpc.client import RpcClient
    from switchyard.rpc.control.topology import PoolTopology
    from switchyard.rpc.drivers import SubprocessDriver
    from switchyard.rpc.settings import ControlSettings, Delays, RpcSettings
    from switchyard.rpc.store import PoolState

    out = Printer()
    settings = RpcSettings.from_env()
    pool = args.pool or f"demo_{uuid.uuid4().hex[:6]}"
    keys = list(KEYS[: max(1, min(args.keys, len(KEYS)))])
    control = ControlSettings(pool, Delays(unbind_s=args.unbind_delay, stop_s=args.stop_delay),
                              reconcile_interval_s=0.5)
    driver = SubprocessDriver(
        (sys.executable, "-m", "switchyard", "worker", "--handler", "switchyard.rpc.examples:demo"),
        min_workers=1, max_workers=2, stop_timeout=5,
        env={"SLEEPY_SECONDS": "1", "SWITCHYARD_LOG_LEVEL": "ERROR"},
    )
    print("Switchyard demo: keyed RPC over RabbitMQ with self-managing worker groups")
    out.line(f"pool {pool} on {redact(settings.connections.amqp_url)} "
             f"({settings.policy.queue_type.value} request queues), pool state in Redis")
    out.line(f"control plane: local runtime running the Lambda handlers; workers as subprocesses; "
             f"unbind after {args.unbind_delay:g} s idle, stop after {args.stop_delay:g} s unbound")

    runtime = LocalControlPlane(control, settings, driver).start()
    watcher = StateWatcher(runtime, pool).start()
    cold: dict[str, float] = {}
    try:
        with RpcClient(pool, settings, concurrency=args.concurrency, timeout=15) as client:
            out.section(f"1. Cold start: calling {len(keys)} keys that have no workers yet")
            started = {key: time.perf_counter() for key in keys}
            futures = {key: client.submit(key, "hello") for key in keys}
            for key, future in futures.items():
                response = future.result(30)
                cold[key] = time.perf_counter() - started[key]
                out.line(f"{key!r:18} {response.status:6} first response after {cold[key] * 1000:6.0f} ms"
                         f"  <- {response.text()[:60]}")

            out.section(f"2. Traffic: {args.seconds:g} s with {args.concurrency} calls in flight over "
                        f"{len(keys)} keys")
            t0 = time.perf_counter()
            latencies, statuses, failures = _pipelined(client, keys, args.seconds, args.concurrency)
            wall = time.perf_counter() - t0
            everything = [x for values in latencies.values() for x in values]
            total = sum(statuses.values()) + sum(failures.values())
            out.line(f"{total:,} calls in {wall:.1f} s = {total / wall:,.0f} calls/s; "
                     f"{LatencySummary.of(everything)}")
            out.line("statuses: " + ", ".join(f"{s} {n:,}" for s, n in statuses.most_common())
                     + (f"; failures: {dict(failures)}" if failures else "; no failures"))
            for key in keys:
                out.line(f"  {key!r:18} {len(latencies[key]):6,} calls, {LatencySummary.of(latencies[key])}")

            out.section("3. Negative responses: the handler's error comes back at once, no timeout")
            client.call("math", "6/3")  # cold start of 'math', not timed
            for body in ("6/3", "1/0", "oops"):
                response = client.call("math", body)
                out.line(f"math {body!r:7} -> {response.status:5} {response.text()[:70]}")

            prefetch = settings.worker_prefetch
            out.section(f"4. Expiration: 'slow' takes 1 s per request and its worker holds {prefetch}; "
                        "the next may wait 0.5 s")
            client.call("slow", "warm up", timeout=20)
            busy = [client.submit("slow", f"busy {i}", timeout=20) for i in range(prefetch)]
            time.sleep(0.2)
            t1 = time.perf_counter()
            late = client.call("slow", "late", timeout=10, expiration_ms=500)
            out.line(f"request behind them -> {late.status!r} after {time.perf_counter() - t1:.2f} s "
                     f"(answered by the dead-letter responder)")
            out.line(f"the {prefetch} busy ones -> {sorted({f.result(20).status for f in busy})}")
            stats = client.stats

        spark_part(out, pool, keys)

        out.section(f"6. Idle: groups unbind after {args.unbind_delay:g} s, stop {args.stop_delay:g} s later")
        idle_from = time.monotonic()
        deadline = idle_from + args.unbind_delay + args.stop_delay + 20
        while time.monotonic() < deadline and (runtime.plane.state.groups() or driver.list_running(pool)):
            time.sleep(0.2)
        for at, key, status in watcher.events:
            if at >= idle_from:
                out.line(f"+{at - idle_from:5.1f} s  {key!r:18} {status}")
        left = runtime.plane.state.groups()
        out.line("all groups stopped and their queues deleted" if not left and not driver.list_running(pool)
                 else f"still up after the wait: {sorted(left)}")
    finally:
        watcher.stop()
        runtime.stop()
        if not args.keep:
            with PoolTopology(pool, settings) as topology:
                topology.delete(force=True)
            PoolState(connect_redis(settings.connections), pool).clear()

    out.section("Summary")
    cold_summary = LatencySummary.of(list(cold.values()))
    out.line(f"cold start (first response for a new key, {len(cold)} keys at once): "
             f"p50 {cold_summary.p50_ms:.0f} ms, max {cold_summary.max_ms:.0f} ms")
    out.line(f"client: {stats.published:,} requests, {stats.responses:,} responses, "
             f"{stats.timeouts} timeouts, {stats.stale_responses} late responses ignored")
    out.line(f"control plane: {runtime.reconcile_passes} reconciler passes; bridges: "
             + ", ".join(f"{s.function_name.split('-')[0]} {s.stats.invocations} invocations"
                         for s in runtime.sources))
    out.line("pool deleted" if not args.keep else f"pool kept: switchyard pool status --pool {pool}")
    delay_scheduler_part(out)
    event_bus_part(out)
    pending_queue_part(out)
    return 0


def spark_part(out: Printer, pool: str, keys: list[str], rows: int = 2000) -> None:
    """The PySpark pipeline in local mode: a JSON Lines file of requests (a few of them bad) called
    in bulk on the running pool, results and errors written as files."""
    import json
    import tempfile
    from pathlib import Path

    out.section(f"5. Bulk: a PySpark job (local[2]) calls {rows:,} rows on the pool, 3 bad rows among them")
    try:
        from pyspark.sql import SparkSession

        from switchyard.spark import job
    except ImportError as exc:  # pyspark is installed by ./dev setup (requirements-spark.txt)
        out.line(f"skipped: {exc} (run ./dev setup)")
        return
    with tempfile.TemporaryDirectory(prefix="switchyard-spark-demo-") as tmp:
        source = Path(tmp) / "requests.jsonl"
        lines = [{"key": keys[n % len(keys)], "body": f"row {n}"} for n in range(rows)]
        lines += [{"body": "no key"}, {"key": "nul\u0000key", "body": "no worker environment carries NUL"},
                  {"key": keys[0], "body": "bad deadline", "deadline": "tomorrow-ish"}]
        source.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
        options = job.PublishOptions(input=str(source), output=str(Path(tmp) / "out"), pool=pool,
                                     output_format="json", timeout_s=15, progress_interval_s=2.0)
        started = time.perf_counter()
        active = SparkSession.getActiveSession()  # e.g. a test's: used, and left running
        try:
            spark = active or job.build_session("local[2]", conf={"spark.ui.enabled": "false",
                                                        "spark.ui.showConsoleProgress": "false"})
            spark.sparkContext.setLogLevel("ERROR")
        except Exception as exc:  # no Java, say: the rest of the demo still runs
            out.line(f"skipped: Spark did not start ({type(exc).__name__}: {exc})")
            return
        try:
            out.line(f"Spark session up in {time.perf_counter() - started:.1f} s")
            job.run(spark, options, report=lambda line: out.line(line))  # progress, then the summary
        finally:
            if active is None:
                spark.stop()


def pending_queue_part(out: Printer, calls: int = 50) -> None:
    """The pending request queue: a polling service connected to node B only, a caller on node A;
    the request goes A -> Redis -> B -> the service over HTTP long poll, and the response back."""
    from dataclasses import replace

    from switchyard.local.http_gateway import HttpGateway
    from switchyard.pending import PendingQueue, PendingSettings, PickupTimeoutError
    from switchyard.pending.api import TokenStore, build_app
    from switchyard.pending.client import PollingService

    settings = PendingSettings.from_env()
    settings = replace(settings, prefix=f"demo{uuid.uuid4().hex[:6]}", pickup_timeout_s=1.0)
    node_a, node_b = PendingQueue(settings).start(), PendingQueue(settings).start()
    tokens = TokenStore.static({"tentacle-1": "demo-token"})
    gateway = HttpGateway(build_app(node_b, tokens), threads=16).start()
    service = PollingService(gateway.url, "tentacle-1", "demo-token", settings=settings, concurrency=2,
                             handler=lambda request: {"ran": request.body, "on": "tentacle-1"}).start()
    out.section("Pending request queue (seed 002): caller on node A, polling service connected to node B")
    try:
        out.line(f"node A {node_a.node_id[:8]} (caller); node B {node_b.node_id[:8]} serves the long poll on "
                 f"{gateway.url}; the service polls node B only")
        latencies = []
        for n in range(calls):
            started = time.perf_counter()
            response = node_a.queue_and_wait("tentacle-1", f"deploy step {n}")
            latencies.append(time.perf_counter() - started)
        out.line(f"{calls} calls A -> Redis -> B -> service -> B -> Redis -> A: last answer {response.body}; "
                 f"{LatencySummary.of(latencies)}")
        try:
            node_a.queue_and_wait("tentacle-2", "nobody polls this")
        except PickupTimeoutError as exc:
            out.line(f"endpoint nobody polls -> {type(exc).__name__} after {settings.pickup_timeout_s:g} s, "
                     "request taken back")
    finally:
        node_b.close()  # first: the service's open long polls end now (204)
        service.stop()
        gateway.stop()
        node_a.close()
        for key in node_a.client.scan_iter(match=f"{settings.prefix}:*"):
            node_a.client.unlink(key)


def event_bus_part(out: Printer) -> None:
    """The event bus: a publisher, two subscribers (one failing, then recovering) and the
    deliveries, over real HTTP on 127.0.0.1 (API, subscribers) with a delivery worker."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import requests

    from switchyard.bus import api
    from switchyard.bus.settings import BusSettings
    from switchyard.bus.store import BusStore
    from switchyard.bus.worker import BusWorker
    from switchyard.core.redis_client import connect_redis
    from switchyard.local.http_gateway import HttpGateway

    started = time.monotonic()
    failures_left = {"billing": 3}

    def subscriber(name: str) -> ThreadingHTTPServer:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                events = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = 503 if failures_left.get(name, 0) > 0 else 204
                failures_left[name] = failures_left.get(name, 0) - 1
                urls = ", ".join(e["url"].rsplit("/", 1)[-1] for e in events)
                out.line(f"+{(time.monotonic() - started) * 1000:5.0f} ms  {name:9} got {len(events)} "
                         f"event(s) [orders {urls}] -> {status}")
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    settings = BusSettings(name=f"demo_{uuid.uuid4().hex[:6]}", root_key=uuid.uuid4().hex,
                           allow_http_callbacks=True, callback_allow="127.0.0.1",  # the subscribers below
                           max_backoff_ms=2000, acquire_timeout_s=0.2)
    store = BusStore(connect_redis(), settings)
    servers = {name: subscriber(name) for name in ("warehouse", "billing")}
    api.configure(store)
    gateway = HttpGateway(api.handle, threads=8).start()
    worker = BusWorker(store, threads=2).start()
    out.section("Event bus (Routemaster's API): a publisher, two subscribers; billing fails 3 times")
    try:
        def post(token: str, path: str, body: dict) -> requests.Response:
            return requests.post(gateway.url + path, json=body, auth=(token, "x"), timeout=10)

        tokens = {name: post(settings.root_key, "/api_tokens", {"name": name}).json()["token"]
                  for name in ("shop", "warehouse", "billing")}
        for name, options in (("warehouse", {"timeout": 0}), ("billing", {"max": 5, "timeout": 200})):
            callback = f"http://127.0.0.1:{servers[name].server_port}/events"
            post(tokens[name], "/subscription",
                 {"topics": ["orders"], "callback": callback, "uuid": name, **options})
        out.line(f"API on {gateway.url}; warehouse: every event at once (timeout 0); "
                 "billing: up to 5 per batch, 200 ms timeout")
        started = time.monotonic()
        for n in range(1, 7):
            event = {"type": "create", "url": f"https://shop.example/orders/{n}"}
            post(tokens["shop"], "/topics/orders", event)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(store.queued(t)[0] for t in tokens.values()):
            time.sleep(0.05)
        for name in ("warehouse", "billing"):
            sub = store.subscriber(tokens[name])
            out.line(f"{name}: {store.queued(tokens[name])[0]} events left, health points "
                     f"{sub.health_points} (-2 per failure, +1 per success); batches in acceptance order")
    finally:
        worker.close()
        gateway.stop()
        api.configure(None)
        for server in servers.values():
            server.shutdown()
        pattern = store.prefix.replace("{", "\\{").replace("}", "\\}") + "*"
        keys = list(store.redis.scan_iter(match=pattern))
        if keys:
            store.redis.delete(*keys)


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="run the local stack with demo traffic and print what happened")
    demo.add_argument("--seconds", type=float, default=5.0, help="length of the traffic phase")
    demo.add_argument("--keys", type=int, default=4, help=f"keys to call (1-{len(KEYS)})")
    demo.add_argument("--concurrency", type=int, default=32, help="calls in flight during the traffic phase")
    demo.add_argument("--unbind-delay", type=float, default=3.0, help="seconds idle before a group unbinds")
    demo.add_argument("--stop-delay", type=float, default=3.0, help="seconds unbound before a group stops")
    demo.add_argument("--pool", help="pool name (default: a fresh demo_<6 hex digits>)")
    demo.add_argument("--keep", action="store_true", help="keep the pool afterwards")
    demo.add_argument("--verbose", action="store_true", help="show the structured logs too")
    add_stack_option(demo)
    demo.set_defaults(func=run_demo)


def delay_scheduler_part(out: Printer, messages: int = 300) -> None:
    """The delay scheduler on the local stack: ``messages`` Chronos messages with delays of 1-5 s go
    through a fresh input topic, the local runtime (enqueue bridge, fire and sweep loops) publishes
    each at its deadline, and a reader with the recommended consumer settings counts and times them."""
    import random
    from datetime import UTC, datetime, timedelta
    from pathlib import Path

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
    fired: list[tuple[str, float, float]] = []  # id, fired (CreateTime) and received, seconds past deadline
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
                message_id = f"{name}-{int(m.value().decode().rsplit('#', 1)[1])}"
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
    counts = Counter(f[0] for f in fired)
    fire = LatencySummary.of([f[1] for f in fired])
    arrival = LatencySummary.of([f[2] for f in fired])
    out.line(f"fired {len(counts)} of {messages}, {sum(1 for c in counts.values() if c == 1)} exactly once, "
             f"{sum(c - 1 for c in counts.values())} duplicates, {messages - len(counts)} missing; "
             f"rows left in Postgres (waiting, ready): {left}")
    out.line(f"published vs deadline: p50 {fire.p50_ms:+.0f} ms, p99 {fire.p99_ms:+.0f} ms, "
             f"max {fire.max_ms:+.0f} ms (the timing advance fires {settings.timing_advance_ms} ms early "
             "by design)")
    out.line(f"received by a reader vs deadline: p50 {arrival.p50_ms:+.0f} ms, p99 {arrival.p99_ms:+.0f} ms, "
             f"max {arrival.max_ms:+.0f} ms (adds the local broker and the reader's fetch)")
    plot = Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}-jitter.png"
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
