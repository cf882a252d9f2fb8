"""The publish job on Spark: read rows, validate, call or schedule them, write results and errors.

The only module that imports pyspark. Layout of ``--output PATH``:

* ``PATH/results``: one row per sent id: ``id, pool, key, status, attempts, latency_ms, response,
  error, deadline, run_id`` (``rows.RESULT_FIELDS`` and the run's id). ``response`` is bytes:
  binary in Parquet, a base64 string in ``--format json`` (JSON has no bytes);
* ``PATH/errors``: one row per bad input row: ``id, pool, key, reason, detail, input_file,
  input_row, run_id``: ``id`` when the row has one, and always where it came from (its file, and
  its data row there from 1: a JSON Lines file's line).

``rows.RESULT_COLUMNS`` and ``rows.ERROR_COLUMNS`` say what each column holds; the Parquet schema
carries the same text as each column's ``comment``.

Delivery is at-least-once, like the rest of Switchyard: a Spark task that fails and is retried
sends its rows again (the worker may see an id twice); Spark's output commit keeps one results row
per id for a run. ``--resume`` appends a new run to ``PATH``: it sends only the ids that have no
final status (``rows.FINAL_STATUSES``) in ``PATH/results``; readers take, per id, the row with a
final status (or the latest run's).
"""

from __future__ import annotations

import math
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

if TYPE_CHECKING:
    from pyspark import RDD

from switchyard.rpc.client.schedule import collect, declare_reply_queue
from switchyard.rpc.control.topology import PoolTopology
from switchyard.rpc.settings import RpcSettings
from switchyard.spark import rows, store
from switchyard.spark.calls import CallOptions
from switchyard.spark.errors import PublishOptionsError
from switchyard.spark.service import PartitionPublisher
from switchyard.spark.settings import SparkSettings, default_spark_env

INPUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "json", ".json": "json",
                 ".ndjson": "json", ".csv": "csv"}
OUTPUT_FORMATS = ("parquet", "json")
# Call partitions by default: one per ROWS_PER_PARTITION rows, and at least PARTITIONS_PER_CORE per
# core, since progress (accumulators) moves only as a partition ends. Each partition opens its own
# connections and a retried task sends its whole partition again. 20,000 rows --no-reply on local[2]
# here: 20 partitions (one per 1,000, the old default) 1,240 rows/s, 8 partitions 1,475, 2: 1,623.
ROWS_PER_PARTITION = 5000
PARTITIONS_PER_CORE = 4


def _column(name: str, data_type: T.DataType, nullable: bool, docs: dict[str, str]) -> T.StructField:
    return T.StructField(name, data_type, nullable, {"comment": docs[name]})


RESULT_SCHEMA = T.StructType([
    _column("id", T.StringType(), False, rows.RESULT_COLUMNS),
    _column("pool", T.StringType(), False, rows.RESULT_COLUMNS),
    _column("key", T.StringType(), False, rows.RESULT_COLUMNS),
    _column("status", T.StringType(), False, rows.RESULT_COLUMNS),
    _column("attempts", T.IntegerType(), False, rows.RESULT_COLUMNS),
    _column("latency_ms", T.DoubleType(), True, rows.RESULT_COLUMNS),
    _column("response", T.BinaryType(), True, rows.RESULT_COLUMNS),
    _column("error", T.StringType(), True, rows.RESULT_COLUMNS),
    _column("deadline", T.StringType(), True, rows.RESULT_COLUMNS),
])
ERROR_SCHEMA = T.StructType([
    _column(name, T.LongType() if name == "input_row" else T.StringType(), name != "reason",
            rows.ERROR_COLUMNS)
    for name in rows.ERROR_FIELDS])
INPUT_FILE_COLUMN = "_switchyard_input_file"  # added to the input to say where each row came from
assert tuple(RESULT_SCHEMA.names) == rows.RESULT_FIELDS


@dataclass(frozen=True)
class PublishOptions:
    """One run of the job (the CLI's and the entry point's flags)."""

    input: str
    output: str
    pool: str | None = None
    input_format: str | None = None  # parquet, json or csv; default: from the input's file names
    output_format: str = "parquet"
    resume: bool = False
    timeout_s: float = 30.0
    retries: int = 2
    concurrency: int = 64
    reply: bool = True  # False (--no-reply): send without reply-to; final (sent) once confirmed
    partitions: int | None = None  # call partitions; default: see ROWS_PER_PARTITION
    progress_interval_s: float = 5.0
    delay_topic: str | None = None  # default: SWITCHYARD_DELAY_INPUT_TOPIC
    reply_queue: str | None = None  # scheduled rows answer into this durable reply queue (its name)
    collect: bool = False  # read the answers of scheduled rows from reply_queue instead of sending


@dataclass
class PublishSummary:
    """What a run did: counts per pool and status, bad rows per reason, latency percentiles."""

    run_id: str
    total: int  # valid rows this run sent
    skipped: int  # ids --resume found already final
    bad: dict[str, int]
    counts: dict[tuple[str, str], int]
    latency_ms: dict[str, tuple[float, float, float]]  # pool -> p50, p95, p99 of answered (or sent) rows
    elapsed_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.total / self.elapsed_s if self.elapsed_s > 0 else math.nan

    def __str__(self) -> str:
        lines = [f"run {self.run_id}: {self.total:,} rows sent in {self.elapsed_s:.1f} s "
                 f"({self.rows_per_s:,.0f} rows/s), {sum(self.bad.values()):,} bad rows, "
                 f"{self.skipped:,} already final (--resume)"]
        for (pool, status), n in sorted(self.counts.items()):
            lines.append(f"  {pool:<24} {status:<16} {n:>10,}")
        for pool, (p50, p95, p99) in sorted(self.latency_ms.items()):
            lines.append(f"  {pool:<24} latency p50 {p50:.1f} ms, p95 {p95:.1f} ms, p99 {p99:.1f} ms")
        for reason, n in sorted(self.bad.items()):
            lines.append(f"  errors: {reason:<24} {n:>10,}")
        return "\n".join(lines)


def build_session(master: str | None = None, app_name: str = "switchyard-publish",
                  conf: dict[str, str] | None = None) -> SparkSession:
    """A session (``master`` None: whatever spark-submit or EMR set); timestamps in UTC."""
    if master and master.startswith("local"):
        # Local tasks run their Python workers with this interpreter (the venv with Switchyard's
        # dependencies), not whatever `python3` is first on PATH.
        default_spark_env("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    if master:
        builder = builder.master(master)
    for name, value in (conf or {}).items():
        builder = builder.config(name, value)
    return builder.getOrCreate()


def input_format(path: str, given: str | None) -> str:
    """``parquet``, ``json`` (JSON Lines) or ``csv``: given, else from the file names."""
    if given:
        if given not in ("parquet", "json", "csv"):
            raise PublishOptionsError(f"--input-format must be parquet, json or csv, got {given!r}")
        return given
    names = [path]
    if "://" not in path and Path(path).is_dir():
        names = [f.name for f in Path(path).iterdir() if not f.name.startswith(("_", "."))]
    found = {INPUT_FORMATS.get(Path(n).suffix.lower()) for n in names} - {None}
    if len(found) != 1:
        raise PublishOptionsError(f"cannot tell the format of {path!r} from its file names; "
                                  "give --input-format")
    return cast(str, found.pop())  # None was taken out of the set


def read_input(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    """The input as the input columns (missing ones null): strings, ``body`` string or binary."""
    reader = spark.read
    df = {"parquet": lambda: reader.parquet(path), "json": lambda: reader.json(path),
          "csv": lambda: reader.option("header", True).csv(path)}[fmt]()
    types = {f.name: f.dataType for f in df.schema.fields}
    if rows.KEY not in types:
        raise PublishOptionsError(f"{path}: the input has no {rows.KEY!r} column "
                                  f"(columns: {', '.join(types) or 'none'})")
    columns = []
    for name in rows.INPUT_COLUMNS:
        if name not in types:
            column = F.lit(None).cast("string")
        elif name == rows.BODY and isinstance(types[name], T.BinaryType):
            column = F.col(name)
        elif name == rows.DEADLINE and isinstance(types[name], T.TimestampType | T.TimestampNTZType):
            column = F.date_format(F.col(name), "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'")
        else:
            column = F.col(name).cast("string")
        columns.append(column.alias(name))
    return df.select(*columns)


def _key_partition(key: str) -> int:
    """Partition by a stable hash of the key (Python's own str hash differs per process)."""
    return zlib.crc32(key.encode("utf-8"))


def _unknown_pools(pools: list[str], settings: RpcSettings) -> set[str]:
    unknown = set()
    for pool in pools:
        with PoolTopology(pool, settings) as topology:
            if not topology.exists():
                unknown.add(pool)
    return unknown


def _path(output: str, name: str) -> str:
    return output.rstrip("/") + "/" + name


def _final_ids(spark: SparkSession, options: PublishOptions) -> DataFrame | None:
    """Ids with a final status in an existing results output (None: there is none)."""
    path = _path(options.output, "results")
    if "://" not in path and not Path(path).exists():
        return None
    try:
        previous = spark.read.format(options.output_format).load(path)
    except Exception as exc:  # AnalysisException: nothing there yet
        if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
            return None
        raise
    return previous.where(F.col("status").isin(sorted(rows.FINAL_STATUSES))).select("id").distinct()


class Progress:
    """Prints rows done / total, rate, failures and ETA every few seconds from a driver thread.

    Reads accumulators, which tasks report when they finish: the count moves a partition at a time.
    """

    def __init__(self, spark: SparkSession, total: int, bad: int, interval_s: float,
                 report: Callable[[str], None]) -> None:
        self.done = spark.sparkContext.accumulator(0)
        self.unfinished = spark.sparkContext.accumulator(0)
        self.total, self.bad, self.interval_s, self.report = total, bad, interval_s, report
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="switchyard-spark-progress", daemon=True)

    def line(self) -> str:
        done, elapsed = self.done.value, time.monotonic() - self._started
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = f"{(self.total - done) / rate:,.0f} s" if rate > 0 else "?"
        share = 100.0 * done / self.total if self.total else 100.0
        return (f"spark publish: {done:,}/{self.total:,} rows ({share:.0f}%), {rate:,.0f} rows/s, "
                f"{self.unfinished.value:,} not final, {self.bad:,} bad rows, ETA {eta}")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.report(self.line())

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run(spark: SparkSession, options: PublishOptions, *, report: Callable[[str], None] | None = None,
        before_send: Callable[[rows.Request], None] | None = None) -> PublishSummary:
    """Run the job on ``spark``; ``before_send`` runs in the tasks before each row's first call.

    With a local master, ``s3://`` input and output go through a local directory (``store``).
    """
    report = report or (lambda line: print(line, file=sys.stderr, flush=True))
    staged = (store.is_s3(options.input), store.is_s3(options.output))
    if not any(staged) or not cast(str, spark.sparkContext.master).startswith("local"):  # a context has one
        return _run(spark, options, report, before_send)
    with store.workdir() as tmp:
        local_input, local_output = options.input, options.output
        if staged[0]:
            local_input = str(store.download(options.input, Path(tmp) / "input"))
        if staged[1]:
            local_output = str(Path(tmp) / "output")
            if options.resume:
                store.download(options.output, Path(tmp) / "output", "--output", prefix_only=True)
        summary = _run(spark, replace(options, input=local_input, output=local_output), report, before_send,
                       (local_input, options.input) if staged[0] else None)
        if staged[1]:
            overwritten = () if options.resume else ("results", "errors")
            store.upload(Path(local_output), options.output, overwritten)
    return summary


def numbered_rows(rdd: RDD[Any]) -> RDD[tuple[dict[str, Any], str, int]]:
    """Each input row as ``(columns, its file, its data row there from 1)``.

    Spark reads a file's rows in order, a split at a time, and lays the splits out in file order
    across partitions: counting each file's rows per partition (one small job, like zipWithIndex's)
    gives every partition where its rows of each file start.
    """

    def counts(index: int, rows: Any) -> list[tuple[tuple[int, str], int]]:
        per_file: dict[str, int] = {}
        for row in rows:
            per_file[row[INPUT_FILE_COLUMN]] = per_file.get(row[INPUT_FILE_COLUMN], 0) + 1
        return [((index, file), n) for file, n in per_file.items()]

    starts: dict[tuple[int, str], int] = {}
    seen: dict[str, int] = {}
    for (index, file), n in sorted(rdd.mapPartitionsWithIndex(counts).collect()):
        starts[(index, file)] = seen.get(file, 0)
        seen[file] = seen.get(file, 0) + n

    def number(index: int, rows: Any) -> Any:
        taken: dict[str, int] = {}
        for row in rows:
            columns = row.asDict()
            file = columns.pop(INPUT_FILE_COLUMN)
            taken[file] = taken.get(file, 0) + 1
            yield columns, file, starts[(index, file)] + taken[file]

    return rdd.mapPartitionsWithIndex(number)


def _run(spark: SparkSession, options: PublishOptions, report: Callable[[str], None],
         before_send: Callable[[rows.Request], None] | None,
         shown_input: tuple[str, str] | None = None) -> PublishSummary:
    """``shown_input``: (local copy, the s3:// input it copies), to name input files as given."""
    if options.output_format not in OUTPUT_FORMATS:
        raise PublishOptionsError(f"--format must be one of {', '.join(OUTPUT_FORMATS)}, "
                                  f"got {options.output_format!r}")
    started = time.monotonic()
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]
    settings = SparkSettings.from_env(options.delay_topic)
    default_pool = options.pool
    reply_queue = None
    if options.reply_queue is not None:  # declared before any row names it
        reply_queue = declare_reply_queue(settings.rpc, options.reply_queue)
    if options.collect:
        return _collect(spark, options, settings, run_id, report, started)

    frame = read_input(spark, options.input, input_format(options.input, options.input_format))
    located = numbered_rows(frame.withColumn(INPUT_FILE_COLUMN, F.input_file_name()).rdd)
    local_input, given_input = shown_input or (None, None)

    def prepare(item: tuple[dict[str, Any], str, int]) -> rows.Request | rows.Rejected:
        row, file, number = item
        return rows.located(rows.prepare(row, default_pool),
                            rows.shown_input_file(file, local_input, given_input), number)

    prepared = located.map(prepare).persist()
    # RDD.filter does not narrow the element type: these casts say what the predicates keep.
    valid = cast("RDD[rows.Request]", prepared.filter(lambda x: isinstance(x, rows.Request)))
    unknown = _unknown_pools(valid.map(lambda x: x.pool).distinct().collect(), settings.rpc)
    rejected = cast("RDD[rows.Rejected]", prepared.filter(lambda x: isinstance(x, rows.Rejected))).union(
        valid.filter(lambda x: x.pool in unknown).map(
            lambda x: rows.rejected_later(x, rows.Reason.UNKNOWN_POOL,
                                          f"pool {x.pool!r} does not exist on the broker; "
                                          f"run: switchyard pool init --pool {x.pool}")))
    valid = valid.filter(lambda x: x.pool not in unknown)

    skipped = 0
    done_ids = _final_ids(spark, options) if options.resume else None
    if done_ids is not None:
        final = done_ids.rdd.map(lambda row: (row.id, None))
        keyed = valid.keyBy(lambda x: x.id)
        before = keyed.count()
        valid = keyed.subtractByKey(final).values().persist()
        skipped = before - valid.count()

    bad = dict(rejected.map(lambda x: (str(x.reason), 1)).reduceByKey(lambda a, b: a + b).collect())
    total = valid.count()
    calls = valid.filter(lambda x: x.deadline is None)
    scheduled = valid.filter(lambda x: x.deadline is not None)
    partitions = options.partitions or max(PARTITIONS_PER_CORE * spark.sparkContext.defaultParallelism,
                                           math.ceil(total / ROWS_PER_PARTITION))
    publisher = PartitionPublisher(
        settings, CallOptions(options.timeout_s, options.retries, options.concurrency, options.reply,
                              reply_queue))

    progress = Progress(spark, total, sum(bad.values()), options.progress_interval_s, report)
    done_acc, unfinished_acc = progress.done, progress.unfinished

    def counted(row: tuple) -> None:
        done_acc.add(1)
        if row[3] not in rows.FINAL_STATUSES:
            unfinished_acc.add(1)

    called = calls.keyBy(lambda x: x.key).partitionBy(partitions, _key_partition).values().mapPartitions(
        lambda it: publisher.call(it, counted, before_send))
    produced = scheduled.mapPartitions(lambda it: publisher.schedule(it, counted))
    mode = "append" if options.resume else "overwrite"

    def write(rdd: Any, schema: T.StructType, name: str) -> None:
        frame = spark.createDataFrame(rdd, schema).withColumn("run_id", F.lit(run_id))
        frame.write.mode(mode).format(options.output_format).save(_path(options.output, name))

    with progress:
        write(called.union(produced), RESULT_SCHEMA, "results")
    write(rejected.map(rows.error_row), ERROR_SCHEMA, "errors")
    elapsed = time.monotonic() - started
    prepared.unpersist()
    valid.unpersist()  # persisted by --resume's filter; a no-op otherwise
    summary = _summarize(spark, options, run_id, total, skipped, bad, elapsed)
    report(progress.line())
    report(str(summary))
    return summary


def _collect(spark: SparkSession, options: PublishOptions, settings: SparkSettings, run_id: str,
             report: Callable[[str], None], started: float) -> PublishSummary:
    """``--collect``: the answers of the ``scheduled`` rows of ``PATH/results`` that have none yet,
    read from the reply queue (waiting up to ``--timeout``) and appended as this run's rows: an id's
    latest row is then its answer. Rows still unanswered stay ``scheduled`` for a later run."""
    if options.reply_queue is None:
        raise PublishOptionsError("--collect reads the answers from a reply queue: give --reply-queue NAME")
    results = spark.read.format(options.output_format).load(_path(options.output, "results"))
    dated = results.where(F.col("deadline").isNotNull()).select("id", "pool", "key", "status", "deadline")
    answered = {row.id
                for row in dated.where(F.col("status") != rows.Status.SCHEDULED.value).collect()}
    waiting = {row.id: row
               for row in dated.where(F.col("status") == rows.Status.SCHEDULED.value).collect()
               if row.id not in answered}
    answers = collect(settings.rpc, options.reply_queue, waiting, options.timeout_s)
    written = [rows.result_row(rows.Request(cid, waiting[cid].pool, waiting[cid].key, b"",
                                            waiting[cid].deadline),
                               response.status, 1, None, response.body,
                               None if response.ok else response.text()[:1000])
               for cid, response in answers.items()]
    frame = spark.createDataFrame(written, RESULT_SCHEMA).withColumn("run_id", F.lit(run_id))
    frame.write.mode("append").format(options.output_format).save(_path(options.output, "results"))
    summary = _summarize(spark, options, run_id, len(written), 0, {}, time.monotonic() - started)
    summary.extra["still_scheduled"] = len(waiting) - len(written)
    report(f"{summary!s}\n  {len(waiting) - len(written):,} scheduled rows not answered yet")
    return summary


# latency: to the answer, or (--no-reply) to the confirm
_TIMED = [rows.Status.OK.value, rows.Status.SENT.value]


def _summarize(spark: SparkSession, options: PublishOptions, run_id: str, total: int, skipped: int,
               bad: dict[str, int], elapsed: float) -> PublishSummary:
    """Counts and percentiles of this run, read back from what was written (nothing is sent again)."""
    written = (spark.read.format(options.output_format).load(_path(options.output, "results"))
               .where(F.col("run_id") == run_id))
    grouped = written.groupBy("pool", "status").count().collect()
    counts = {(row.pool, row.status): row["count"] for row in grouped}
    latency = {
        row.pool: tuple(row.q) for row in written.where(F.col("status").isin(_TIMED)).groupBy("pool")
        .agg(F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], 10000).alias("q")).collect()
        if row.q is not None  # --collect's rows have no latency
    }
    return PublishSummary(run_id, total, skipped, bad, counts, latency, elapsed)


def main(options: PublishOptions, master: str | None = None) -> int:
    """Run in this process's session (built here, and then stopped, unless one is already active):
    0 when every sent row reached a final status, else 1."""
    if master and master.startswith("local"):  # local mode binds to loopback unless told otherwise
        default_spark_env("SPARK_LOCAL_IP", "127.0.0.1")
    active = SparkSession.getActiveSession()
    spark = active or build_session(master)
    try:
        summary = run(spark, options)
    finally:
        if active is None:
            spark.stop()
    unfinished = sum(n for (_, status), n in summary.counts.items() if status not in rows.FINAL_STATUSES)
    return 0 if unfinished == 0 else 1
