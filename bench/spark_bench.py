"""PySpark pipeline benchmark: the publish job end to end, its publish side against raw confirmed
publishes from one process, and its scaling from 1 to 2 cores, in one run.

A pool with echo workers (one per key, started and warmed once by the local control plane) serves
every measurement, so the cold path is not timed. The three measures:

* end to end: ``switchyard spark publish`` rows/s on ``local[1]`` and ``local[2]`` (the scaling),
  each row a call answered by its echo worker;
* publish side: the same job with ``--no-reply`` on ``local[2]`` (every row published without
  reply-to, final once the broker confirms it) over the rows/s of one process publishing the same
  requests with plain pika and publisher confirms (``confirm_delivery``: each publish confirmed
  before the next, the simplest safe publisher) to a queue nobody reads; the ratio the issue aims
  at (>= 0.8). Both figures are whole runs: the job's include reading the input, validating it,
  the shuffle by key and writing the results, the baseline's only the publishes. The echo workers
  consume what the job sends, as they would in use.

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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")

from switchyard.local.rpc_runtime import LocalControlPlane  # noqa: E402
from switchyard.redis_client import connect_redis  # noqa: E402
from switchyard.rpc.client import RpcClient  # noqa: E402
from switchyard.rpc.control_plane import ControlSettings  # noqa: E402
from switchyard.rpc.drivers import SubprocessDriver  # noqa: E402
from switchyard.rpc.reconciler import Delays  # noqa: E402
from switchyard.rpc.settings import RpcSettings  # noqa: E402
from switchyard.rpc.state import PoolState  # noqa: E402
from switchyard.rpc.topology import PoolTopology  # noqa: E402


def write_rows(path: Path, rows: int, keys: list[str]) -> None:
    with path.open("w") as out:
        for n in range(rows):
            out.write(json.dumps({"key": keys[n % len(keys)], "body": f"row {n}"}) + "\n")


def raw_confirmed_publishes(url: str, rows: int) -> float:
    """rows/s of one process publishing ``rows`` requests with confirms (to a throwaway queue)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.confirm_delivery()
        props = pika.BasicProperties(correlation_id="x", reply_to=queue, delivery_mode=2)
        started = time.perf_counter()
        for n in range(rows):
            channel.basic_publish("", queue, f"row {n}".encode(), props, mandatory=True)
        return rows / (time.perf_counter() - started)
    finally:
        connection.close()


def spark_rows_per_s(master: str, source: Path, out_dir: Path, pool: str, reply: bool = True
                     ) -> tuple[float, str]:
    from pyspark.sql import SparkSession

    from switchyard.spark import job

    spark = job.build_session(master, "switchyard-bench", {"spark.ui.enabled": "false",
                                                           "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        options = job.PublishOptions(input=str(source), output=str(out_dir), pool=pool, output_format="json",
                                     timeout_s=60, progress_interval_s=3600, reply=reply)
        started = time.perf_counter()
        summary = job.run(spark, options, report=lambda _line: None)
        elapsed = time.perf_counter() - started
    finally:
        spark.stop()
        SparkSession._instantiatedSession = None  # a new master next time
    statuses = ", ".join(f"{status} {n:,}" for (_, status), n in sorted(summary.counts.items()))
    return summary.total / elapsed, statuses


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
                              env={**os.environ, "SWITCHYARD_LOG_LEVEL": "ERROR"})
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
            raw = raw_confirmed_publishes(settings.connections.amqp_url, args.rows)
            print(f"raw confirmed publishes, one process: {raw:,.0f} rows/s", flush=True)
            results = {}
            for cores in (1, 2):
                rate, statuses = spark_rows_per_s(f"local[{cores}]", source, Path(tmp) / f"out{cores}", pool)
                results[cores] = rate
                print(f"spark publish local[{cores}]: {rate:,.0f} rows/s end to end ({statuses})", flush=True)
            sent, statuses = spark_rows_per_s("local[2]", source, Path(tmp) / "sent", pool, reply=False)
            print(f"spark publish --no-reply local[2]: {sent:,.0f} rows/s ({statuses})", flush=True)
        print(f"publish side (--no-reply, local[2]) vs raw confirmed publishes: {sent / raw:.2f} "
              "(aim >= 0.8)")
        print(f"end to end (local[2]) vs raw confirmed publishes: {results[2] / raw:.2f}")
        print(f"scaling 1 -> 2 cores, end to end: {results[2] / results[1]:.2f}x")
    finally:
        runtime.stop()
        with PoolTopology(pool, settings) as topology:
            topology.delete(force=True)
        PoolState(connect_redis(settings.connections), pool).clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
