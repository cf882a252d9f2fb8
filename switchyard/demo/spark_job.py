"""Step 5 of the RPC demo: the PySpark pipeline in local mode, calling the running pool in bulk."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from switchyard.demo.printer import Printer


def spark_part(out: Printer, pool: str, keys: list[str], rows: int = 2000) -> None:
    """The PySpark pipeline in local mode: a JSON Lines file of requests (a few of them bad) called
    in bulk on the running pool, results and errors written as files."""
    out.section(f"5. Bulk: a PySpark job (local[2]) calls {rows:,} rows on the pool, 3 bad rows among them")
    try:
        from pyspark.sql import SparkSession

        from switchyard.spark import job
    except ImportError as exc:  # pyspark: the [spark] extra
        out.line(f"skipped: {exc} (pip install 'switchyard[spark]' to run it)")
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
