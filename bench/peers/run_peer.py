"""One peer of the delay benchmark at one offered rate: arq (Redis, ``_defer_until``) or procrastinate
(Postgres, ``schedule_at``), one worker process, run under the peers' own virtual environment
(bench/peers/setup.sh). bench/delay_bench.py runs it beside Switchyard; alone:

    .local/peers-venv/bin/python bench/peers/run_peer.py arq --rate 1000 --duration 20 --out r.json

The parent offers jobs at ``--rate`` for ``--duration`` seconds, each due ``min..max-delay`` seconds
later and carrying its due time; the worker (a child process) records when each job ran. Lateness
is run time - due time, measured inside the worker: no broker crossing, unlike Switchyard's figure.
The JSON printed has the sustained rate, lateness, lost, duplicates, the worker's CPU per job and
the store server's CPU (Redis, or the Postgres backends of the peer's worker).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.stats import cpu_seconds, lateness_summary, listener_pid, load_average  # noqa: E402

REDIS_URL = os.environ.get("SWITCHYARD_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get("SWITCHYARD_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/switchyard")
RESULTS: list[Any] = []  # in the worker: its results file, line-buffered (a killed worker loses nothing)


def _record(job_id: str, due_ms: float) -> None:
    RESULTS[0].write(f"{job_id} {due_ms} {time.time() * 1000}\n")


def _open_results(path: str) -> None:
    RESULTS.append(open(path, "a", buffering=1))  # noqa: SIM115  (closed when the worker ends)


def _read_results(path: str) -> list[tuple[str, float, float]]:
    rows = []
    for line in Path(path).read_text().splitlines() if Path(path).exists() else []:
        job_id, due, ran = line.split()
        rows.append((job_id, float(due), float(ran)))
    return rows


# -- arq -------------------------------------------------------------------------------------------

async def arq_job(ctx: dict[str, Any], due_ms: float) -> None:
    _record(ctx["job_id"], due_ms)


def arq_worker(args: argparse.Namespace) -> None:
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    _open_results(args.results)
    worker = Worker(functions=[func(arq_job, name="job", keep_result=0)], queue_name=args.queue,
                    redis_settings=RedisSettings.from_dsn(REDIS_URL), poll_delay=args.poll_s,
                    max_jobs=args.concurrency, keep_result=0, handle_signals=True)
    worker.run()


async def arq_offer(args: argparse.Namespace, jobs: list[tuple[str, float]]) -> None:
    from arq import create_pool
    from arq.connections import RedisSettings

    pool = await create_pool(RedisSettings.from_dsn(REDIS_URL))
    try:
        await _paced(args, jobs, lambda job_id, due: pool.enqueue_job(
            "job", due * 1000, _job_id=job_id, _queue_name=args.queue,
            _defer_until=datetime.fromtimestamp(due, UTC)))
    finally:
        await pool.aclose()


# -- procrastinate -----------------------------------------------------------------------------------

def procrastinate_app(dsn: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="job", queue="bench", pass_context=True)
    async def job(context: Any, due_ms: float) -> None:
        _record(str(context.job.id), due_ms)

    app.job_fn = job  # type: ignore[attr-defined]
    return app


def procrastinate_worker(args: argparse.Namespace) -> None:
    _open_results(args.results)
    procrastinate_app(args.dsn).run_worker(queues=["bench"], concurrency=args.concurrency, wait=True,
                                           listen_notify=True, fetch_job_polling_interval=args.poll_s,
                                           delete_jobs="always")


async def procrastinate_offer(args: argparse.Namespace, jobs: list[tuple[str, float]]) -> None:
    app = procrastinate_app(args.dsn)
    async with app.open_async():
        await _paced(args, jobs, lambda _job_id, due: app.job_fn.configure(  # type: ignore[attr-defined]
            schedule_at=datetime.fromtimestamp(due, UTC)).defer_async(due_ms=due * 1000))


def procrastinate_database(name: str, create: bool) -> str:
    """A database of the peer's own (its schema is procrastinate's), made or dropped on the server."""
    import psycopg

    with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
        conn.execute(f'{"CREATE" if create else "DROP"} DATABASE {"" if create else "IF EXISTS "}"{name}"'
                     + ("" if create else " WITH (FORCE)"))
    return POSTGRES_DSN.rsplit("/", 1)[0] + f"/{name}?application_name={name}"


# -- offering at a rate ------------------------------------------------------------------------------

async def _paced(args: argparse.Namespace, jobs: list[tuple[str, float]], submit: Any) -> None:
    """Submit the jobs at the offered rate (a tick's worth at a time, concurrently) for the duration;
    due times are relative to submission. Records how many were sent, from when, for how long."""
    start = time.time()
    sent, tick = 0, 0.01
    while sent < len(jobs) and (elapsed := time.time() - start) < args.duration:  # no catching up
        target = min(len(jobs), int((elapsed + tick) * args.rate))
        now = time.time()
        await asyncio.gather(*(submit(job_id, now + delay) for job_id, delay in jobs[sent:target]))
        sent = target
        await asyncio.sleep(max(0.0, start + target / args.rate - time.time()))
    args.offered_s, args.start, args.sent = time.time() - start, start, sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", choices=["arq", "procrastinate"])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--min-delay", type=float, default=3.0)
    parser.add_argument("--max-delay", type=float, default=10.0)
    parser.add_argument("--poll-s", type=float, default=0.01, help="the worker's poll interval")
    parser.add_argument("--concurrency", type=int, default=10, help="jobs at once in the one worker")
    parser.add_argument("--out", help="write the summary JSON here too")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        (arq_worker if args.peer == "arq" else procrastinate_worker)(args)
        return 0

    name = f"bench_{args.peer}_{uuid.uuid4().hex[:8]}"
    args.queue, args.results = f"{name}:queue", str(ROOT / "bench" / "results" / f"{name}.txt")
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    if args.peer == "procrastinate":
        args.dsn = procrastinate_database(name, create=True)
        with procrastinate_app(args.dsn).open() as app:
            app.schema_manager.apply_schema()
    server_pids = [listener_pid(6379)] if args.peer == "arq" else []
    worker = subprocess.Popen([sys.executable, __file__, args.peer, "--worker", "--queue", args.queue,
                               "--dsn", str(args.dsn), "--results", args.results,
                               "--poll-s", str(args.poll_s), "--concurrency", str(args.concurrency)])
    time.sleep(2.0)  # worker connected and polling
    if args.peer == "procrastinate":
        server_pids = _backend_pids(args.dsn)
    load_before = load_average()
    rnd = random.Random(args.rate)
    jobs = [(f"{args.rate}-{n}", rnd.uniform(args.min_delay, args.max_delay))
            for n in range(int(args.rate * args.duration))]
    cpu0 = cpu_seconds(worker.pid)
    srv0 = sum(cpu_seconds(p) for p in server_pids if p)
    asyncio.run((arq_offer if args.peer == "arq" else procrastinate_offer)(args, jobs))
    drain(args)
    cpu1 = cpu_seconds(worker.pid)
    srv1 = sum(cpu_seconds(p) for p in server_pids if p)
    load_after = load_average()
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
    rows = _read_results(args.results)
    if args.peer == "procrastinate":
        procrastinate_database(name, create=False)
    else:
        import redis

        with redis.Redis.from_url(REDIS_URL) as r:
            r.delete(args.queue)
    done = max(1, len(rows))
    summary = {
        "system": args.peer, "rate_offered": args.rate, "sent": args.sent,
        "rate_achieved": round(args.sent / args.offered_s, 1),
        **lateness_summary(rows, args.sent, (args.start + args.max_delay, args.start + args.duration)),
        "cpu_us_per_job": round((cpu1 - cpu0) / done * 1e6, 1),
        "server_cpu_us_per_job": round((srv1 - srv0) / done * 1e6, 1) if server_pids else None,
        "load_avg_before": load_before, "load_avg_after": load_after,
        "settings": {"poll_s": args.poll_s, "concurrency": args.concurrency},
    }
    text = json.dumps(summary)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


def _backend_pids(dsn: str) -> list[int]:
    """Server processes of the peer's own database (its worker's and its offerer's connections)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                                           " AND datname = current_database()")]


def remaining_jobs(args: argparse.Namespace) -> int:
    """Jobs offered but not run yet (a backlog, not a loss: the run waits for it to drain)."""
    if args.peer == "arq":
        import redis

        with redis.Redis.from_url(REDIS_URL) as r:
            return int(r.zcard(args.queue))
    import psycopg

    with psycopg.connect(args.dsn) as conn:
        row = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
                           ).fetchone()
    return int(row[0]) if row else 0


def drain(args: argparse.Namespace) -> None:
    """After the last job came due: wait while the backlog shrinks (at most 60 s, 10 s without progress)."""
    time.sleep(args.max_delay + 2.0)
    end, last, stalled_since = time.time() + 60, -1, time.time()
    while time.time() < end:
        left = remaining_jobs(args)
        if left == 0:
            return
        if left != last:
            last, stalled_since = left, time.time()
        elif time.time() - stalled_since > 10:
            return
        time.sleep(0.5)


if __name__ == "__main__":
    raise SystemExit(main())
