"""CPU cost of one sequential call, in instructions, for each side: Switchyard's and plain pika's
client and worker, counted by valgrind's callgrind (repeatable on a loaded machine, unlike time).

Each side runs twice, with ``--calls`` and three times as many; the difference of the totals over
the difference of the calls is the cost of one call, without start-up and connection setup.

    .venv/bin/python bench/rpc_cost.py --calls 200      # about two minutes per implementation
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rpc_bench import wait_consumers  # noqa: E402
from switchyard.rpc import protocol  # noqa: E402
from switchyard.rpc.control.topology import PoolTopology  # noqa: E402
from switchyard.rpc.drivers import WorkerGroup  # noqa: E402
from switchyard.rpc.settings import PoolPolicy, RpcSettings  # noqa: E402

CLIENT = """
import sys
from bench.plain_pika import PlainClient
from switchyard.rpc.client import RpcClient
impl, pool, queue, url, calls = sys.argv[1:6]
if impl == "plain":
    client = PlainClient(url, queue)
    for _ in range(int(calls)):
        client.publish()
        while client.pending:
            client.connection.process_data_events(time_limit=None)
else:
    client = RpcClient(pool, timeout=60)
    for _ in range(int(calls)):
        client.call("k", b"x")
client.close()
"""


def callgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no"]


def instructions(out: Path) -> int:
    """The run's total instruction count (all threads: callgrind writes one file per thread)."""
    total = 0
    for part in out.parent.glob(out.name + "*"):
        found = re.search(r"^(?:summary|totals): (\d+)", part.read_text(errors="replace"), re.M)
        total += int(found.group(1)) if found else 0
    return total


def run_once(impl: str, calls: int, pool: str, plain_queue: str, url: str, tmp: Path) -> tuple[int, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SWITCHYARD_LOG_LEVEL": "ERROR", "WORKER_PREFETCH": "4"}
    tag = f"{impl}-{calls}"
    worker_out, client_out = tmp / f"worker-{tag}.out", tmp / f"client-{tag}.out"
    if impl == "plain":
        worker_cmd = [sys.executable, str(ROOT / "bench" / "plain_pika.py"), "worker", plain_queue, "4", url]
    else:
        worker_cmd = [sys.executable, "-m", "switchyard", "worker", "--handler",
                      "switchyard.rpc.examples:echo"]
        env = {**env, **WorkerGroup(pool, "k").environment("cost-worker")}
    worker = subprocess.Popen(callgrind(worker_out) + worker_cmd, env=env)
    try:
        wait_consumers(url, plain_queue if impl == "plain" else protocol.request_queue(pool, "k"),
                       timeout=300)
        client = [sys.executable, "-c", CLIENT, impl, pool, plain_queue, url, str(calls)]
        subprocess.run(callgrind(client_out) + client, env=env, check=True, timeout=1800)
    finally:
        time.sleep(1)
        worker.send_signal(signal.SIGTERM)  # SIGINT is ignored in a background job
        worker.wait(300)
    return instructions(client_out), instructions(worker_out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls in the short run (the long run: 3x)")
    parser.add_argument("--impls", default="plain,switchyard", help="comma-separated: plain,switchyard")
    parser.add_argument("--queue-type", choices=["quorum", "classic"], default="quorum")
    args = parser.parse_args()
    # Under callgrind a process runs some 50 times slower: give the AMQP handshake time.
    url = RpcSettings.from_env().connections.amqp_url.split("?")[0] + "?stack_timeout=300&socket_timeout=120"
    os.environ["SWITCHYARD_AMQP_URL"] = url
    base = RpcSettings.from_env()
    policy = PoolPolicy(**{**vars(base.policy), "queue_type": protocol.QueueType(args.queue_type)})
    settings = RpcSettings(**{**vars(base), "policy": policy})
    pool = f"cost_{uuid.uuid4().hex[:6]}"
    plain_queue = f"{pool}-plain"
    with PoolTopology(pool, settings) as topology:  # closed before the runs: it would idle past its heartbeat
        topology.declare()
        topology.ensure_request_queue("k")
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as connection:
        connection.channel().queue_declare(plain_queue, durable=True,
                                           arguments={"x-queue-type": args.queue_type})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for impl in args.impls.split(","):
                short = run_once(impl, args.calls, pool, plain_queue, url, Path(tmp))
                long = run_once(impl, 3 * args.calls, pool, plain_queue, url, Path(tmp))
                client, worker = ((b - a) / (2 * args.calls) for a, b in zip(short, long, strict=True))
                print(f"{impl:10} instructions per call: client {client:,.0f}   worker {worker:,.0f}",
                      flush=True)
    finally:
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(url))) as connection:
            connection.channel().queue_delete(plain_queue)
        with PoolTopology(pool, settings) as topology:
            topology.delete(force=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
