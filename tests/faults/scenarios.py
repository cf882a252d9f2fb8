"""Every scenario of the fault suite, at two sizes: ``full`` (``./dev faults``) and ``short`` (CI)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from switchyard.core.config import Connections
from tests.faults import bus, cluster_node, cuts, delay, malformed, pending, redis_failover, rpc
from tests.faults.account import Account

RPC_SIZES = {"full": rpc.RpcSize(requests=2000, keys=12, rate=100), "short": rpc.RpcSize(300, 6, 60)}
DELAY_SIZES = {"full": delay.DelaySize(chunks=20, chunk=300, every=0.5),
               "short": delay.DelaySize(chunks=10, chunk=100, every=0.5)}
# The Kafka restart: everything produced up front; no deadline in the second before the kill.
KAFKA_KILL_AT = 4.5
KAFKA_SIZES = {size: delay.DelaySize(d.chunks, d.chunk, d.every, produce_every=0.02,
                                     gap=(KAFKA_KILL_AT - 1.0, KAFKA_KILL_AT + 0.5))
               for size, d in DELAY_SIZES.items()}


def rabbitmq4() -> Connections:
    """The suite's own RabbitMQ 4.0 (scripts/rabbitmq4.sh), which the restart scenario may disturb."""
    port = os.environ.get("SWITCHYARD_RABBITMQ4_PORT", "5673")
    mgmt = os.environ.get("SWITCHYARD_RABBITMQ4_MGMT_PORT", "15673")
    return replace(Connections.from_env(), amqp_url=f"amqp://guest:guest@127.0.0.1:{port}/%2F",
                   management_url=f"http://guest:guest@127.0.0.1:{mgmt}")


def ensure_rabbitmq4() -> None:
    """Start the 4.0 broker if it is not answering (reused when it is)."""
    status = subprocess.run([*rpc.RABBITMQ4_SCRIPT, "status"], capture_output=True, timeout=60)
    if status.returncode != 0:
        subprocess.run([*rpc.RABBITMQ4_SCRIPT, "start"], check=True, capture_output=True, timeout=600)


def rabbitmq4_dead_lettering() -> str:
    """``running`` or ``stranded``: the 4.0 node's at-least-once dead-letter supervisor, asked directly."""
    done = subprocess.run([*rpc.RABBITMQ4_SCRIPT, "dead-lettering"], capture_output=True, text=True,
                          timeout=60)
    if done.returncode not in (0, 4):
        raise RuntimeError(f"scripts/rabbitmq4.sh dead-lettering failed: {done.stderr.strip()}")
    return done.stdout.strip()


def restart_rabbitmq4() -> None:
    subprocess.run([*rpc.RABBITMQ4_SCRIPT, "restart"], check=True, capture_output=True, timeout=180)


def _kafka_restart(size: str, workdir: Path) -> Account:
    broker = delay.private_kafka(workdir)
    broker.start()
    try:
        return delay.run_delay("delay: Kafka broker restarted", delay.restart_kafka(broker, KAFKA_KILL_AT),
                               KAFKA_SIZES[size], workdir, bootstrap=broker.bootstrap)
    finally:
        broker.kill()


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[str, Path], Account]  # (size, workdir) -> account
    in_ci: bool = True  # its short size runs in ./dev test (tests/faults/test_faults.py)


def _on_rabbitmq4(name: str, fault: rpc.Fault) -> Scenario:
    """A fault of the 4.0 broker, then the rig's teardown deletes the pool: the sequence that once
    stranded the broker's at-least-once dead-lettering (rabbitmq-server#16652) and failed every later
    run. The broker is left healthy whatever happens; a stranded one fails the scenario."""

    def run(size: str, workdir: Path) -> Account:
        ensure_rabbitmq4()
        account = rpc.run_rpc(name, fault, RPC_SIZES[size], workdir, rabbitmq4())
        if rabbitmq4_dead_lettering() != "running":
            restart_rabbitmq4()
            raise AssertionError(
                "the scenario stranded RabbitMQ 4.0's dead-letter supervisor (restarted since)")
        return account

    return Scenario(name, run)


def _rpc(name: str, fault: rpc.Fault) -> Scenario:
    return Scenario(name, lambda size, workdir: rpc.run_rpc(name, fault, RPC_SIZES[size], workdir))


def _delay(name: str, fault: delay.Fault) -> Scenario:
    return Scenario(name, lambda size, workdir: delay.run_delay(name, fault, DELAY_SIZES[size], workdir))


BUS_KILL = "bus: SIGKILL worker mid-delivery"
PENDING_KILL = "pending: SIGKILL node, requests taken"
STRANGERS = "strangers: malformed messages at every consumer"
CLUSTER_KILL = "RabbitMQ: a cluster node killed and restarted under traffic"
REDIS_FAILOVER = "pending + bus: Redis Cluster master SIGKILLed, replica promoted"

SCENARIOS = [
    _rpc("rpc: SIGKILL workers", rpc.kill_workers),
    _rpc("rpc: SIGKILL control plane", rpc.kill_control_plane),
    _rpc("rpc: Redis state flushed", rpc.flush_state),
    _on_rabbitmq4("rpc: RabbitMQ 4.0 restarted", rpc.restart_rabbitmq),
    _on_rabbitmq4("rpc: RabbitMQ 4.0 SIGKILLed", rpc.kill_rabbitmq),
    Scenario(CLUSTER_KILL, lambda size, workdir: cluster_node.run_cluster_kill(
        CLUSTER_KILL, cluster_node.SIZES[size], workdir)),
    _delay("delay: SIGKILL mid-batch", delay.kill_fire_loop),
    _delay("delay: Postgres backends killed", delay.kill_postgres_connections),
    Scenario("delay: Kafka broker restarted", _kafka_restart),
    *(Scenario(name, run, ci) for name, run, ci in cuts.scenarios(RPC_SIZES, DELAY_SIZES)),
    Scenario(BUS_KILL, lambda size, workdir: bus.run_bus(BUS_KILL, bus.SIZES[size], workdir)),
    Scenario(PENDING_KILL,
             lambda size, workdir: pending.run_pending(PENDING_KILL, pending.SIZES[size], workdir)),
    Scenario(REDIS_FAILOVER, lambda size, workdir: redis_failover.run_failover(
        REDIS_FAILOVER, redis_failover.SIZES[size], workdir)),
    Scenario(STRANGERS,
             lambda size, workdir: malformed.run_strangers(STRANGERS, malformed.SIZES[size], workdir)),
]
