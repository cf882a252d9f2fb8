"""The names of the counts the publish job reports, defined once.

The job emits no CloudWatch metric: what it counts goes into the run's summary, printed on stderr
at the end (``job.PublishSummary``: the rows sent, the ids ``--resume`` found already final, the bad
rows per reason, then per pool and status) and returned to the caller (``job.run``: the demo and
the benchmark read it). Progress lines in between come from Spark accumulators. These are the names
under which the summary's totals are known (``summary_counts``); ``SUMMARY_FIELDS`` maps each
``PublishSummary`` field to its name, and a test checks the fields exist, so a rename fails there.
"""

from __future__ import annotations

from collections.abc import Mapping

SPARK_ROWS_SENT = "SparkRowsSent"  # valid rows this run sent (called, sent or scheduled)
SPARK_ROWS_ALREADY_FINAL = "SparkRowsAlreadyFinal"  # ids --resume skipped: final in an earlier run
SPARK_ROWS_BAD = "SparkRowsBad"  # rows written to PATH/errors, every reason together

SUMMARY_FIELDS: Mapping[str, str] = {
    "total": SPARK_ROWS_SENT,
    "skipped": SPARK_ROWS_ALREADY_FINAL,
    "bad": SPARK_ROWS_BAD,
}

EMITTED: frozenset[str] = frozenset({SPARK_ROWS_SENT, SPARK_ROWS_ALREADY_FINAL, SPARK_ROWS_BAD})


def summary_counts(summary: object) -> dict[str, int]:
    """A ``PublishSummary``'s totals by name (``bad``, counted per reason there, summed here)."""
    counts = {}
    for field, name in SUMMARY_FIELDS.items():
        value = getattr(summary, field)
        counts[name] = sum(value.values()) if isinstance(value, Mapping) else value
    return counts
