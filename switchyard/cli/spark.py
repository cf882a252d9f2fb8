"""``switchyard spark``: the publish job locally (``publish``); EMR Serverless (``submit``, ``package``).

pyspark is imported only when ``publish`` runs, so ``switchyard --help`` works without it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from switchyard.cli.options import AT_LEAST_ONE, COUNT, POSITIVE, add_commands
from switchyard.cli.preflight import require
from switchyard.core.errors import ConfigError
from switchyard.delay.settings import DELAY
from switchyard.spark import emr, package
from switchyard.spark.rows import FORMAT_HELP


def add_publish_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's options, shared by ``switchyard spark publish`` and ``jobs/publish_requests.py``."""
    parser.add_argument("--input", required=True, metavar="PATH",
                        help="rows to send: Parquet, JSON Lines or CSV, a file or a directory, local or "
                             "s3:// (columns: key; optional body, pool, id, deadline)")
    parser.add_argument("--output", required=True, metavar="PATH",
                        help="where PATH/results (one row per id) and PATH/errors (bad rows) are written")
    parser.add_argument("--pool", help="pool of rows without a pool column value")
    parser.add_argument("--format", dest="output_format", choices=("parquet", "json"), default="parquet",
                        help=FORMAT_HELP)
    parser.add_argument("--input-format", choices=("parquet", "json", "csv"),
                        help="default: from the input's file names (.parquet, .jsonl/.json, .csv)")
    parser.add_argument("--resume", action="store_true",
                        help="append a run to an existing output, sending only ids without a final status")
    parser.add_argument("--timeout", dest="timeout_s", type=POSITIVE, default=30.0, metavar="S",
                        help="seconds one call may wait for its answer (default 30)")
    parser.add_argument("--retries", type=COUNT, default=2, metavar="N",
                        help="retries of a call that timed out or that the broker lost (default 2)")
    parser.add_argument("--concurrency", type=AT_LEAST_ONE, default=64, metavar="N",
                        help="calls in flight per Spark partition (default 64)")
    parser.add_argument("--no-reply", dest="reply", action="store_false",
                        help="send requests that expect no answer (no reply-to): a row is final, status "
                             "sent, once the broker confirms it; workers' answers are not collected")
    parser.add_argument("--partitions", type=AT_LEAST_ONE, metavar="N",
                        help="call partitions (default: one per 5,000 rows, at least 4 per core)")
    parser.add_argument("--progress-interval", dest="progress_interval_s", type=POSITIVE, default=5.0,
                        metavar="S", help="seconds between progress lines (default 5)")
    parser.add_argument("--delay-topic", help="where rows with a deadline go (default "
                                              f"{DELAY['input_topic'].name})")
    parser.add_argument("--reply-queue", metavar="NAME",
                        help="scheduled rows answer into the durable reply queue switchyard-reply-NAME "
                             "(default: their answers are not kept); read them with --collect")
    parser.add_argument("--collect", action="store_true",
                        help="send nothing (--input is not read): append the answers of the scheduled "
                             "rows of PATH/results that have none yet, from --reply-queue, waiting up to "
                             "--timeout; rows not answered yet stay scheduled")
    parser.add_argument("--master", help="Spark master, e.g. local[2] "
                                         "(default: spark-submit's, else local[*])")


def check_input(path: str) -> None:
    """A local input that is not there fails now, not after Spark's start-up (s3:// is read later)."""
    if "://" not in path and not Path(path).exists():
        raise ConfigError(f"--input {path}: no such file or directory; give a file, a directory or an "
                          "s3:// URI")


def options_from_args(args: argparse.Namespace):  # -> job.PublishOptions (pyspark imported lazily)
    """The job's options from parsed arguments."""
    from switchyard.spark.job import PublishOptions

    if args.concurrency < 1 or (args.partitions is not None and args.partitions < 1):
        raise ConfigError("--concurrency and --partitions must be at least 1")
    if not args.collect:
        check_input(args.input)
    return PublishOptions(
        input=args.input, output=args.output, pool=args.pool, input_format=args.input_format,
        output_format=args.output_format, resume=args.resume, timeout_s=args.timeout_s,
        retries=args.retries, concurrency=args.concurrency, reply=args.reply, partitions=args.partitions,
        progress_interval_s=args.progress_interval_s, delay_topic=args.delay_topic,
        reply_queue=args.reply_queue, collect=args.collect)


def run_publish(args: argparse.Namespace) -> int:
    try:
        from switchyard.spark import job
    except ImportError as exc:
        raise ConfigError(f"pyspark is not installed ({exc}): pip install 'switchyard[spark]' (and a "
                          "Java 17+ runtime, which Spark needs)") from exc
    return job.main(options_from_args(args), args.master)


def cmd_publish(args: argparse.Namespace) -> int:
    """``switchyard spark publish``: the broker checked (and the input found) before Spark starts."""
    if not args.collect:
        check_input(args.input)
    require("amqp")
    return run_publish(args)


def main(argv: Sequence[str] | None = None) -> int:
    """The spark-submit entry point's body: parse the job's arguments and run it."""
    parser = argparse.ArgumentParser(prog="publish_requests", description=PUBLISH_DESCRIPTION)
    add_publish_arguments(parser)
    return run_publish(parser.parse_args(argv))


PUBLISH_DESCRIPTION = (
    "Send every input row as a call to its pool's workers (rows without a deadline) or schedule it "
    "through the delay scheduler (rows with an ISO-8601 deadline). Bad rows go to PATH/errors with "
    "the reason; every sent row ends in PATH/results with id, pool, key, status, attempts, latency_ms "
    "and the response or error. Delivery is at-least-once: a retried Spark task may send rows again "
    "(same id). Progress every few seconds on stderr, a summary at the end; exit 1 if a row ended "
    "without a final status (rerun with --resume).")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``spark`` and its subcommands to the ``switchyard`` command line."""
    spark = subparsers.add_parser("spark", help="the PySpark pipeline: publish requests in bulk",
                                  description="The PySpark pipeline (pyspark: pip install "
                                              "'switchyard[spark]').")
    spark.set_defaults(func=lambda _args: spark.print_help() or 2)
    sub = add_commands(spark, "spark_command")
    publish = sub.add_parser("publish", help="run the publish job with a local (or given) Spark master",
                             description=PUBLISH_DESCRIPTION)
    add_publish_arguments(publish)
    publish.set_defaults(func=cmd_publish)
    emr.add_submit_parsers(sub)
    package.add_package_parser(sub)
