"""The publish job end to end on local[2]: real RabbitMQ, workers started by the local control plane."""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from switchyard import cli
from switchyard.delay.model import CHRONOS_HEADERS
from switchyard.delay.parsing import format_deadline
from switchyard.local.delay_runtime import LocalRuntime
from switchyard.rpc import protocol
from switchyard.rpc.client import RpcClient
from switchyard.spark import rows
from switchyard.spark.job import PublishOptions, run
from tests.conftest import ROOT, subprocess_env, unique, wait_for

ECHO = "tests.rpc.handlers:control_plane_echo"


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def results(spark, output: Path, name: str = "results") -> list:
    return spark.read.parquet(str(output / name)).collect()


def test_ten_thousand_rows_over_a_hundred_new_keys_are_all_answered_once(
        spark, make_pool, planes, tmp_path: Path) -> None:
    pool, settings = make_pool()
    planes.start(pool, settings, handler=ECHO)
    input_rows = [{"key": f"key-{i % 100}", "body": f"row-{i}"} for i in range(10_000)]
    source = write_jsonl(tmp_path / "rows.jsonl", input_rows)
    lines: list[str] = []
    started = time.monotonic()
    summary = run(spark, PublishOptions(source, str(tmp_path / "out"), pool=pool, timeout_s=60,
                                        progress_interval_s=2), report=lines.append)
    elapsed = time.monotonic() - started
    written = results(spark, tmp_path / "out")
    expected = {rows.stable_id(pool, row["key"], row["body"].encode(), None): row for row in input_rows}
    assert len(written) == 10_000
    assert {row.id for row in written} == set(expected)
    for row in written:
        assert (row.status, row.pool, row.key) == ("ok", pool, expected[row.id]["key"]), row
        assert row.response == expected[row.id]["body"].encode()
        assert row.attempts >= 1 and row.latency_ms > 0
    assert summary.counts == {(pool, "ok"): 10_000} and summary.bad == {}
    assert "10,000/10,000 rows" in lines[-2], lines
    periodic = lines[:-2]  # every 2 s while the calls ran: done / total, rate, ETA
    assert periodic and all("/10,000 rows (" in line and "rows/s" in line and "ETA" in line
                            for line in periodic), lines
    print(f"\n10,000 rows over 100 new keys: {10_000 / elapsed:,.0f} rows/s end to end "
          f"({elapsed:.1f} s incl. reading and writing); {summary}")


def logged_pool(make_pool, planes, tmp_path: Path) -> tuple[str, Path]:
    """A pool whose workers (started by its control plane) log each request's body, at once."""
    pool, settings = make_pool()
    log = tmp_path / "requests.log"
    planes.start(pool, settings, handler="tests.rpc.handlers:slow_logged",
                 worker_env={"START_LOG": str(log), "SLOW_SECONDS": "0"})
    return pool, log


def fail_once(marker: str, at_body: str, request: rows.Request) -> None:
    """A ``before_send`` hook: the first time ``at_body`` comes up, the task dies (after a pause in
    which the rows before it are published and answered); the marker file makes it happen once."""
    if request.body.decode() == at_body and not os.path.exists(marker):
        Path(marker).write_text("failed once\n")
        time.sleep(0.5)  # pace: the task dies after a while, not at once
        raise RuntimeError("task killed half-way (test)")


def test_a_task_killed_half_way_is_retried_and_nothing_is_lost(
        spark, make_pool, planes, tmp_path: Path) -> None:
    pool, log = logged_pool(make_pool, planes, tmp_path)
    rows = [{"key": f"k{i % 4}", "body": f"row-{i}"} for i in range(200)]
    marker = tmp_path / "failed"
    hook = functools.partial(fail_once, str(marker), "row-120")  # k0's 31st of 50 rows
    summary = run(spark, PublishOptions(write_jsonl(tmp_path / "rows.jsonl", rows), str(tmp_path / "out"),
                                        pool=pool, timeout_s=60, partitions=2),
                  report=lambda _line: None, before_send=hook)
    assert marker.exists(), "the hook never failed the task"
    written = results(spark, tmp_path / "out")
    assert sorted(row.response.decode() for row in written) == sorted(row["body"] for row in rows)
    assert len({row.id for row in written}) == len(written) == 200
    assert {row.status for row in written} == {"ok"} and summary.counts == {(pool, "ok"): 200}
    served = Counter(line.split(" ", 1)[1] for line in log.read_text().splitlines())
    assert set(served) == {row["body"] for row in rows}
    resent = {body for body, n in served.items() if n > 1}
    assert resent, "the retried task sent nothing again: the failure was not half-way"
    assert served["row-120"] == 1  # the hook failed the task before this row's first send


def test_bad_rows_go_to_errors_with_their_reasons_and_scheduled_rows_fire_at_their_deadlines(
        spark, make_pool, planes, settings, connections, store, output, tmp_path: Path) -> None:
    pool, rpc_settings = make_pool()
    planes.start(pool, rpc_settings, handler=ECHO)
    soon = datetime.now(UTC) + timedelta(seconds=4)
    rows = [
        {"key": "a", "body": "called", "id": "call-1"},
        {"key": "a", "body": "scheduled", "id": "sched-1", "deadline": format_deadline(soon)},
        {"key": "b", "body": "naive", "id": "sched-2",
         "deadline": (soon + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%f")},
        {"body": "no key", "id": "bad-1"},
        {"key": "nul\x00", "id": "bad-2"},
        {"key": "x" * 5000, "id": "bad-3"},
        {"key": "a", "id": "bad-4", "deadline": "tomorrow"},
        {"key": "a", "id": "bad-5", "pool": "no-such-pool"},
        {"key": "a", "id": "bad-6", "pool": "nosuchpool_1"},
        {"key": "a", "id": "x" * 200},
    ]
    local = LocalRuntime(settings, connections)
    local.start()
    try:
        summary = run(spark, PublishOptions(write_jsonl(tmp_path / "rows.jsonl", rows), str(tmp_path / "out"),
                                            pool=pool, timeout_s=30, output_format="json",
                                            delay_topic=settings.input_topic), report=lambda _line: None)
        fired = wait_for_headers(output, {"sched-1", "sched-2"}, timeout=20)
    finally:
        local.join()
    written = {row.id: row for row in spark.read.json(str(tmp_path / "out" / "results")).collect()}
    assert {i: row.status for i, row in written.items()} == {
        "call-1": "ok", "sched-1": "scheduled", "sched-2": "scheduled"}
    errors = {row.id: row for row in spark.read.json(str(tmp_path / "out" / "errors")).collect()}
    assert {i: row.reason for i, row in errors.items()} == {
        "bad-1": "missing_key", "bad-2": "invalid_key", "bad-3": "invalid_key", "bad-4": "invalid_deadline",
        "bad-5": "invalid_pool", "bad-6": "unknown_pool", "x" * 200: "invalid_id"}
    assert "4096" in errors["bad-3"].detail and "nosuchpool_1" in errors["bad-6"].detail
    # Each errors row says which input row failed: its file and line (JSON Lines), id or not.
    lines = {row.get("id"): number for number, row in enumerate(rows, 1)}
    assert {i: (row.input_file, row.input_row) for i, row in errors.items()} == {
        i: (str(tmp_path / "rows.jsonl"), lines[i]) for i in errors}
    assert summary.bad == {"missing_key": 1, "invalid_key": 2, "invalid_deadline": 1, "invalid_pool": 1,
                           "unknown_pool": 1, "invalid_id": 1}
    deadlines = {"sched-1": soon, "sched-2": soon + timedelta(seconds=1)}
    for row_id, message in fired.items():
        headers = dict(message.headers())
        assert (headers[protocol.POOL_HEADER] == pool.encode()
                and message.key() == headers[protocol.KEY_HEADER])
        assert message.value() in (b"scheduled", b"naive")
        assert not CHRONOS_HEADERS & set(headers)  # the scheduler consumed its own headers
        fired_ms = message.timestamp()[1]
        assert fired_ms >= deadlines[row_id].timestamp() * 1000 - settings.timing_advance_ms - 5, row_id


def wait_for_headers(reader, ids: set[str], timeout: float) -> dict:
    """Output messages by their ``x-switchyard-id`` header, once all of ``ids`` arrived."""
    found: dict = {}

    def arrived() -> bool:  # the poll is the interval: it blocks on the topic
        for message in reader.poll(0.2):
            found[dict(message.headers() or []).get(protocol.ID_HEADER, b"").decode()] = message
        return ids <= set(found)

    wait_for(arrived, timeout, interval=0, required=False)
    assert ids <= set(found), f"not on the delay output topic: {ids - set(found)}"
    return found


def test_resume_sends_only_the_ids_without_a_final_status(
        spark, make_pool, planes, tmp_path: Path) -> None:
    pool, settings = make_pool()
    planes.start(pool, settings, handler=ECHO)
    rows = [{"key": "fast", "body": f"fast-{i}", "id": f"f{i}"} for i in range(20)]
    rows += [{"key": "slow", "body": "slow:1.5", "id": f"s{i}"} for i in range(2)]
    source, out = write_jsonl(tmp_path / "rows.jsonl", rows), str(tmp_path / "out")
    with RpcClient(pool, settings, timeout=60) as client:  # workers up: only "slow" may time out
        assert [client.call(key, "warm").ok for key in ("fast", "slow")] == [True, True]
    first = run(spark, PublishOptions(source, out, pool=pool, timeout_s=1.0, retries=0),
                report=lambda _line: None)
    assert first.counts == {(pool, "ok"): 20, (pool, "timeout"): 2}
    second = run(spark, PublishOptions(source, out, pool=pool, timeout_s=30, resume=True),
                 report=lambda _line: None)
    assert (second.total, second.skipped) == (2, 20)
    written = results(spark, tmp_path / "out")
    by_run = Counter((row.run_id, row.status) for row in written)
    assert by_run == {(first.run_id, "ok"): 20, (first.run_id, "timeout"): 2, (second.run_id, "ok"): 2}
    assert {row.id for row in written if row.run_id == second.run_id} == {"s0", "s1"}


def test_no_reply_rows_are_final_once_confirmed_and_every_worker_gets_them(
        spark, make_pool, planes, tmp_path: Path) -> None:
    pool, log = logged_pool(make_pool, planes, tmp_path)
    rows = [{"key": f"k{i % 3}", "body": f"row-{i}"} for i in range(300)]
    source, out = write_jsonl(tmp_path / "rows.jsonl", rows), str(tmp_path / "out")
    summary = run(spark, PublishOptions(source, out, pool=pool, timeout_s=30, reply=False),
                  report=lambda _line: None)
    assert summary.counts == {(pool, "sent"): 300} and summary.bad == {}
    assert pool in summary.latency_ms  # to the confirm
    written = results(spark, tmp_path / "out")
    assert len({row.id for row in written}) == len(written) == 300
    assert all((row.status, row.response, row.error) == ("sent", None, None) and row.latency_ms > 0
               for row in written)
    # The workers (started on the orphaned keys) take every sent row; nobody waits for an answer.
    wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 300, timeout=60,
             what="the workers to take all 300 sent rows")
    assert sorted(line.split(" ", 1)[1] for line in log.read_text().splitlines()) == \
        sorted(row["body"] for row in rows)
    again = run(spark, PublishOptions(source, out, pool=pool, resume=True, reply=False),
                report=lambda _line: None)
    assert (again.total, again.skipped) == (0, 300)  # sent is final: --resume sends none again


def test_the_command_line_reads_csv_from_s3_and_writes_json_lines_back(
        spark, make_pool, planes, tmp_path: Path, capsys) -> None:
    """``switchyard spark publish`` (in this process: it uses the active session), S3 at moto."""
    pool, settings = make_pool()
    planes.start(pool, settings, handler=ECHO)
    s3, bucket = boto3.client("s3"), unique("spark").replace("_", "-")
    s3.create_bucket(Bucket=bucket)
    lines = ["key,body,id"] + [f"k{i % 2},csv-{i},c{i}" for i in range(20)] + [",no key,c-bad"]
    s3.put_object(Bucket=bucket, Key="in/rows.csv", Body="\n".join(lines).encode())
    status = cli.main(["spark", "publish", "--input", f"s3://{bucket}/in/", "--output", f"s3://{bucket}/out",
                       "--pool", pool, "--format", "json", "--timeout", "60", "--progress-interval", "1"])
    stderr = capsys.readouterr().err
    assert status == 0, stderr[-3000:]
    assert "20/20 rows (100%)" in stderr and f"{pool:<24} ok" in stderr, stderr[-3000:]
    written = read_json_lines(s3, bucket, "out/results/")
    assert {row["id"]: (row["status"], row["key"]) for row in written} == {
        f"c{i}": ("ok", f"k{i % 2}") for i in range(20)}
    assert [(row["id"], row["reason"], row["input_file"], row["input_row"])
            for row in read_json_lines(s3, bucket, "out/errors/")] == [
        ("c-bad", "missing_key", f"s3://{bucket}/in/rows.csv", 21)]  # the 21st data row, after the header
    # JSON has no bytes: the response column is base64, as --help and the job's docs say.
    assert {base64.b64decode(row["response"]) for row in written} == {f"csv-{i}".encode() for i in range(20)}
    assert not spark.sparkContext._jsc.sc().isStopped()  # the CLI left the active session running


def read_json_lines(s3, bucket: str, prefix: str) -> list[dict]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return [json.loads(line) for key in keys if key.endswith(".json")
            for line in s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode().splitlines()]


def test_parquet_input_keeps_binary_bodies_and_reads_timestamp_deadlines_as_utc(
        spark, tmp_path: Path) -> None:
    from pyspark.sql import types as T

    from switchyard.spark.job import input_format, read_input

    schema = T.StructType([T.StructField("key", T.LongType()), T.StructField("body", T.BinaryType()),
                           T.StructField("deadline", T.TimestampType())])
    when = datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    path = str(tmp_path / "rows.parquet")
    spark.createDataFrame([(7, b"\x00\xff", when), (8, None, None)], schema).write.parquet(path)
    assert input_format(path, None) == "parquet"
    prepared = [rows.prepare(row.asDict(), "p") for row in read_input(spark, path, "parquet").collect()]
    assert sorted(prepared, key=lambda x: x.key) == [
        rows.Request(rows.stable_id("p", "7", b"\x00\xff", "2030-05-06T07:08:09.123Z"), "p", "7", b"\x00\xff",
                     "2030-05-06T07:08:09.123Z"),
        rows.Request(rows.stable_id("p", "8", b"", None), "p", "8", b"", None)]


def test_the_spark_submit_entry_point_takes_the_same_options() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "publish_requests.py"), "--help"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    options = ("--input", "--output", "--pool", "--format", "--resume", "--timeout", "--retries", "--master",
               "--no-reply")
    assert all(option in proc.stdout for option in options), proc.stdout
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "publish_requests.py"), "--input", "x"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--output" in proc.stderr


def test_the_demo_step_calls_its_rows_and_reports_the_bad_ones(
        make_pool, planes, spark, capsys: pytest.CaptureFixture[str]) -> None:
    """`switchyard demo`'s Spark step on a running pool: every good row answered, each bad one named."""
    from switchyard.demo import Printer, spark_part

    pool, settings = make_pool()
    planes.start(pool, settings, handler=ECHO)
    spark_part(Printer(), pool, ["a", "b"], rows=200)
    printed = capsys.readouterr().out
    assert f"{pool}" in printed and "200/200 rows (100%)" in printed
    assert " ok " in printed and "200" in printed.split(" ok ", 1)[1].split("\n", 1)[0]
    for reason in ("missing_key", "invalid_key", "invalid_deadline"):
        assert f"errors: {reason}" in printed
    assert spark.sparkContext._jsc is not None  # the shared session was left running


def test_scheduled_rows_answer_into_a_reply_queue_that_a_collect_run_reads(
        spark, make_pool, planes, settings, connections, store, tmp_path: Path) -> None:
    pool, rpc_settings = make_pool()
    planes.start(pool, rpc_settings, handler=ECHO)
    soon, reply = datetime.now(UTC) + timedelta(seconds=2), unique("r")
    later = soon + timedelta(seconds=1)
    rows = [{"key": "a", "body": "one", "id": "s-1", "deadline": format_deadline(soon)},
            {"key": "b", "body": "two", "id": "s-2", "deadline": format_deadline(later)}]
    source, out = write_jsonl(tmp_path / "rows.jsonl", rows), str(tmp_path / "out")
    local = LocalRuntime(settings, connections)  # the scheduler and the relay into the pool
    local.start()
    try:
        run(spark, PublishOptions(source, out, pool=pool, output_format="json", reply_queue=reply,
                                  delay_topic=settings.input_topic), report=lambda _line: None)
        summary = run(spark, PublishOptions(source, out, output_format="json", reply_queue=reply,
                                            collect=True, timeout_s=60), report=lambda _line: None)
    finally:
        local.join()
        with RpcClient(pool, rpc_settings) as client:  # the queue is the caller's: it deletes it
            client.collect(reply)
        delete_reply_queue(rpc_settings, reply)
    written = spark.read.json(str(tmp_path / "out" / "results")).collect()
    by_id: dict[str, list] = {}
    for row in sorted(written, key=lambda row: row.run_id):
        by_id.setdefault(row.id, []).append((row.status, row.response))
    assert by_id == {"s-1": [("scheduled", None), ("ok", base64.b64encode(b"one").decode())],
                     "s-2": [("scheduled", None), ("ok", base64.b64encode(b"two").decode())]}
    assert summary.counts == {(pool, "ok"): 2}


def delete_reply_queue(settings, name: str) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(settings.connections.amqp_url))
    connection.channel().queue_delete(protocol.reply_queue(name))
    connection.close()
