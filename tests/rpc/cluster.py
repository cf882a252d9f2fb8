"""The three-node RabbitMQ 4.0 cluster of scripts/rabbitmq-cluster.sh, for the tests and the fault
scenario that kill one of its nodes: where its nodes listen, and making sure all three run.

Its ports come from SWITCHYARD_RABBITMQ_CLUSTER_PORT (node N on base + N - 1; management on
base + 10000 + N - 1), the cluster's own epmd from SWITCHYARD_RABBITMQ_CLUSTER_EPMD_PORT, as the
script reads them.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace

from switchyard.core.config import Connections
from switchyard.rpc.client import RpcClient
from tests.conftest import ROOT

SCRIPT = str(ROOT / "scripts/rabbitmq-cluster.sh")
NODES = (1, 2, 3)


def base_port() -> int:
    return int(os.environ.get("SWITCHYARD_RABBITMQ_CLUSTER_PORT", "5680"))


def node_url(node: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{base_port() + node - 1}/%2F"


def management_url(node: int) -> str:
    return f"http://guest:guest@127.0.0.1:{base_port() + 10000 + node - 1}"


def urls(*nodes: int) -> str:
    """SWITCHYARD_AMQP_URL listing ``nodes`` (all three by default)."""
    return ",".join(node_url(n) for n in nodes or NODES)


def node_of_port(port: int) -> int:
    return port - base_port() + 1


def connections(amqp_url: str, management_node: int = 1) -> Connections:
    """The environment's connections (a Redis Cluster's flag and timeouts included), RabbitMQ's
    replaced by the cluster's."""
    return replace(Connections.from_env(), amqp_url=amqp_url, management_url=management_url(management_node))


def _script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout)


def running() -> set[int]:
    """The nodes the cluster lists running (none if no node answers)."""
    status = _script("status", timeout=60)
    return {n for n in NODES if f"n{n}@" in status.stdout} if status.returncode == 0 else set()


def ensure_running() -> None:
    """Start the cluster if no node answers, or each node that is down: three running nodes after."""
    up = running()
    if not up:
        _check(_script("start", timeout=600))
    for node in set(NODES) - up if up else ():
        start_node(node)


def kill(node: int) -> None:
    """SIGKILL ``node``: a crash (its data kept)."""
    _check(_script("kill", str(node), timeout=60))


def start_node(node: int) -> None:
    """Start ``node`` again and wait until the cluster lists it running."""
    _check(_script("start-node", str(node)))


def stop_node(node: int) -> None:
    """A clean stop of ``node`` (its data kept)."""
    _check(_script("stop-node", str(node), timeout=120))


def ctl(node: int, *args: str) -> str:
    """``rabbitmqctl ARGS`` against ``node``: what it printed."""
    done = _script("ctl", str(node), *args, timeout=120)
    _check(done)
    return done.stdout.strip()


def _check(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(done.args)} failed: {done.stderr.strip()[-2000:]}")


def client_node(client: RpcClient) -> int:
    """The node an ``RpcClient`` is connected to now."""
    connection = client._core._connection
    assert connection is not None, "the client has no connection"
    return node_of_port(int(connection._impl.params.port))


def heal_dead_lettering() -> str:
    """``running``, or the nodes whose at-least-once dead-letter supervisor was stranded
    (rabbitmq-server#16652), each restarted since so the cluster is healthy either way."""
    done = _script("dead-lettering", timeout=60)
    if done.returncode not in (0, 4):
        _check(done)
    answer = done.stdout.strip()
    for node in NODES:
        if answer != "running" and f"n{node}@" in answer:
            _check(_script("stop-node", str(node)))
            start_node(node)
    return answer
