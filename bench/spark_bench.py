"""PySpark pipeline benchmark: the publish job end to end, its publish side against raw confirmed
publishes from one process, and its scaling from 1 to 2 cores, in one run.

A pool with echo workers (one per key, started and warmed once by the local control plane) serves
every measurement, so the cold path is not timed. The three measures:

* end to end: ``switchyard spark publish`` rows/s on ``local[1]`` and ``local[2]`` (the scaling),
  each row a call answered by its echo worker;
* publish side: the same job with ``--no-reply`` on ``local[2]`` (every row published without
  reply-to, final once the broker confirms it) over the rows/s of one process publishing the same
  requests (pool exchange, keys, persistent, mandatory, into the same quorum queues) with plain pika
  and publisher confirms, two ways: each publish confirmed before the next (``confirm_delivery``,
  the simplest safe publisher) and 64 publishes awaiting their confirms (``SelectConnection``, the
  fast one, the anchor of the ratio the issue aims at, >= 0.8). The job's figure is a whole run:
  reading the input, validating it, the shuffle by key and writing the results; the baselines' only
  the publishes. The echo workers consume what is sent, as they would in use.

Each job figure is the second of two runs in one session (the first, printed beside it, pays for
starting Spark's Python workers and warming the JVM, as any first job of a session does).

    .venv/bin/python bench/spark_bench.py                 # 20,000 rows over 20 keys
    .venv/bin/python bench/spark_bench.py --rows 50000 --keys 50
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika
import pika.spec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")

from switchyard.core.redis_client import connect_redis  # noqa: E402
from switchyard.local.rpc_runtime import LocalControlPlane  # noqa: E402
from switchyard.rpc import protocol  # noqa: E402
from switchyard.rpc.client import RpcClient  # noqa: E402
from switchyard.rpc.control.topology import PoolTopology  # noqa: E402
from switchyard.rpc.drivers import SubprocessDriver  # noqa: E402
from switchyard.rpc.settings import ControlSettings, Delays, RpcSettings  # noqa: E402
from switchyard.rpc.store import PoolState  # noqa: E402


def write_rows(path: Path, rows: int, keys: list[str]) -> None:
    with path.open("w") as out:
        for n in range(rows):
            out.write(json.dumps({"key": keys[n % len(keys)], "body": f"row {n}"}) + "\n")


def _requests(rows: int, keys: list[str]) -> list[tuple[str, bytes, pika.BasicProperties]]:
    """What the job sends with --no-reply: (routing key, body, properties) per row, keys in turn."""
    return [(protocol.routing_key(keys[n % len(keys)]), f"row {n}".encode(),
             pika.BasicProperties(delivery_mode=2, headers={protocol.KEY_HEADER: keys[n % len(keys)]}))
            for n in range(rows)]


def raw_sequential(url: str, pool: str, rows: int, keys: list[str]) -> float:
    """rows/s of one process publishing the rows to the pool (its quorum queues), each publish
    confirmed before the next (``confirm_delivery``): the simplest safe publisher."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        requests = _requests(rows, keys)
        started = time.perf_counter()
        for routing_key, body, props in requests:
            channel.basic_publish(protocol.req_exchange(pool), routing_key, body, props, mandatory=True)
        return rows / (time.perf_counter() - started)
    finally:
        connection.close()


def raw_pipelined(url: str, pool: str, rows: int, keys: list[str], window: int = 64) -> float:
    """rows/s of one process publishing the rows to the pool with ``window`` publishes awaiting their
    confirms (pika's SelectConnection, as its asynchronous publisher example does): the fast anchor."""
    requests = iter(_requests(rows, keys))
    state = {"sent": 0, "acked": 0, "started": 0.0, "elapsed": 0.0}
    unconfirmed: set[int] = set()  # delivery tags: confirms of different queues come in any order
    exchange = protocol.req_exchange(pool)

    def publish_more(channel) -> None:
        while len(unconfirmed) < window:
            request = next(requests, None)
            if request is None:
                return
            routing_key, body, props = request
            channel.basic_publish(exchange, routing_key, body, props, mandatory=True)
            state["sent"] += 1
            unconfirmed.add(state["sent"])  # delivery tags count publishes from 1

    def on_confirm(frame) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            raise RuntimeError("the broker nacked a publish")
        tag = method.delivery_tag
        tags = {t for t in unconfirmed if t <= tag} if method.multiple else {tag}
        unconfirmed.difference_update(tags)
        state["acked"] += len(tags)
        if state["acked"] >= rows:
            state["elapsed"] = time.perf_counter() - state["started"]
            connection.close()
        else:
            publish_more(channel_box[0])

    def on_channel(channel) -> None:
        channel_box.append(channel)
        channel.confirm_delivery(on_confirm, callback=lambda _frame: start(channel))

    def start(channel) -> None:
        state["started"] = time.perf_counter()
        publish_more(channel)

    channel_box: list = []
    connection = pika.SelectConnection(
        pika.URLParameters(url), on_open_callback=lambda conn: conn.channel(on_open_callback=on_channel),
        on_close_callback=lambda *_args: connection.ioloop.stop())
    connection.ioloop.start()
    if state["acked"] < rows:
        raise RuntimeError(f"the pipelined publisher stopped after {state['acked']} of {rows} confirms")
    return rows / state["elapsed"]


def spark_rows_per_s(master: str, source: Path, out_dir: Path, pool: str, reply: bool = True
                     ) -> tuple[float, float, str]:
    """(rows/s of the first run in a new session, rows/s of a second run in it, statuses of the
    second): the first pays for starting the Python workers and warming the JVM."""
    from pyspark.sql import SparkSession

    from switchyard.spark import job

    spark = job.build_session(master, "switchyard-bench", {"spark.ui.enabled": "false",
                                                           "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    rates = []
    try:
        for run in ("cold", "warm"):
            options = job.PublishOptions(input=str(source), output=str(out_dir / run), pool=pool,
                                         output_format="json", timeout_s=60, progress_interval_s=3600,
                                         reply=reply)
            started = time.perf_counter()
            summary = job.run(spark, options, report=lambda _line: None)
            rates.append(summary.total / (time.perf_counter() - started))
    finally:
        spark.stop()
        SparkSession._instantiatedSession = None  # a new master next time
    statuses = ", ".join(f"{status} {n:,}" for (_, status), n in sorted(summary.counts.items()))
    return rates[0], rates[1], statuses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=20)
    args = parser.parse_args()
    settings = RpcSettings.from_env()
    pool = f"bench_spark_{uuid.uuid4().hex[:6]}"
    keys = [f"k{n}" for n in range(args.keys)]
    driver = SubprocessDriver((sys.executable, "-m", "switchyard", "worker", "--handler",
                               "switchyard.rpc.examples:echo"), min_workers=1, max_workers=1,
                              env={"SWITCHYARD_LOG_LEVEL": "ERROR"})
    control = ControlSettings(pool, Delays(unbind_s=600, stop_s=600), reconcile_interval_s=1.0)
    print(f"pool {pool}: {args.keys} keys, one echo worker each; {args.rows:,} rows per run", flush=True)
    runtime = LocalControlPlane(control, settings, driver).start()
    try:
        with RpcClient(pool, settings, concurrency=args.keys, timeout=60) as client:
            for future in [client.submit(key, "warm") for key in keys]:
                assert future.result(90).ok
        print("workers warm", flush=True)
        with tempfile.TemporaryDirectory(prefix="switchyard-spark-bench-") as tmp:
            source = Path(tmp) / "rows.jsonl"
            write_rows(source, args.rows, keys)
            url = settings.connections.amqp_url
            sequential = raw_sequential(url, pool, args.rows, keys)
            print(f"raw publishes to the pool, one process, each confirmed before the next: "
                  f"{sequential:,.0f} rows/s", flush=True)
            pipelined = raw_pipelined(url, pool, args.rows, keys)
            print(f"raw publishes to the pool, one process, 64 awaiting confirms: {pipelined:,.0f} rows/s",
                  flush=True)
            results = {}
            for cores in (1, 2):
                cold, rate, statuses = spark_rows_per_s(f"local[{cores}]", source, Path(tmp) / f"out{cores}",
                                                        pool)
                results[cores] = rate
                print(f"spark publish local[{cores}]: {rate:,.0f} rows/s end to end ({statuses}); "
                      f"first run in the session {cold:,.0f} rows/s", flush=True)
            cold, sent, statuses = spark_rows_per_s("local[2]", source, Path(tmp) / "sent", pool, reply=False)
            print(f"spark publish --no-reply local[2]: {sent:,.0f} rows/s, whole run ({statuses}); "
                  f"first run in the session {cold:,.0f} rows/s", flush=True)
        print(f"publish side (--no-reply, local[2]) vs raw pipelined: {sent / pipelined:.2f} (aim >= 0.8); "
              f"vs raw one at a time: {sent / sequential:.2f}")
        print(f"end to end (local[2]) vs raw pipelined: {results[2] / pipelined:.2f}")
        print(f"scaling 1 -> 2 cores, end to end: {results[2] / results[1]:.2f}x")
    finally:
        runtime.stop()
        with PoolTopology(pool, settings) as topology:
            topology.delete(force=True)
        PoolState(connect_redis(settings.connections), pool).clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
