"""Network cuts: a TCP proxy between the runtime and RabbitMQ, Redis, Postgres or Kafka.

The proxy (``tests/pending/tcp_proxy.py``) carries only the runtime's connections to one service
(``switchyard local`` and its workers for RabbitMQ and Redis, ``switchyard delay run`` for Postgres
and Kafka); the harness's calls, counting and reading go direct wherever they can, so whatever is
lost was lost by the runtime. Kafka clients connect where the broker advertises, so there a private
tansu advertises the proxy and the harness crosses it too (it produces everything before the cut).

Three cuts of each: for 5 s and for 60 s (every connection closed, new ones refused meanwhile), and
half-open (every connection silent for good, new ones silent for 5 s: only the runtime's own
heartbeats and timeouts can notice). The fault ends when the proxy forwards again; the recovery time
runs from there.

Callers wait out the outage: an RPC request carries its caller's timeout as its expiration, and one
whose caller gave up is expired by design (answered ``expired``, never worked on), which the account
would count as lost. So the calls of a cut wait the usual 60 s plus the outage and, for a half-open
one, its detection; the delay scheduler's account waits as long for what is due.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from urllib.parse import urlsplit

from switchyard.core.config import Connections
from tests.delay.conftest import Tansu, free_port
from tests.faults import delay, rpc
from tests.faults.account import Account
from tests.pending.tcp_proxy import CuttableProxy

HALF_OPEN_S = 5.0  # how long new connections stay silent in a half-open cut
# Until the runtime notices a half-open connection: two AMQP heartbeats (30 s each) and a little,
# librdkafka's request timeout, the delay store's 30 s deadline; Redis's 5 s timeout is well inside.
DETECTION_S = 65.0


class Cut(StrEnum):
    CLOSED = "cut"  # connections closed (FIN), new ones refused
    HALF_OPEN = "half-open"  # connections silent for good, no RST; new ones silent for a while


@dataclass(frozen=True)
class Outage:
    """One cut: what, for how long (a half-open cut's old connections stay dead whatever this is)."""

    cut: Cut
    seconds: float

    def waited(self) -> float:
        """How long the runtime may be away: the outage, and the detection of a half-open one."""
        return self.seconds + (DETECTION_S if self.cut is Cut.HALF_OPEN else 0.0)

    def label(self) -> str:
        return "half-open" if self.cut is Cut.HALF_OPEN else f"cut {self.seconds:g} s"

    def apply(self, proxy: CuttableProxy) -> float:
        """Start the cut; returns when it will be over (time.monotonic())."""
        (proxy.hang if self.cut is Cut.HALF_OPEN else proxy.cut)(self.seconds)
        return time.monotonic() + self.seconds


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, f"no port in {url}"
    return port


# -- RPC: RabbitMQ and Redis --------------------------------------------------------------------------
RPC_SERVICES = {"RabbitMQ": ("SWITCHYARD_AMQP_URL", "amqp_url"),
                "Redis": ("SWITCHYARD_REDIS_URL", "redis_url")}


def rpc_cut(name: str, service: str, outage: Outage, sizes: dict[str, rpc.RpcSize],
            ) -> Callable[[str, Path], Account]:
    """Calls through a pool whose control plane and workers reach ``service`` through the proxy."""
    variable, field = RPC_SERVICES[service]

    def run(size: str, workdir: Path) -> Account:
        url = getattr(Connections.from_env(), field)
        proxy = CuttableProxy(port_of(url))

        def fault(rig: rpc.RpcRig, traffic: rpc.RpcTraffic) -> int:
            traffic.wait_progress(0.3)
            started = time.monotonic()
            over = outage.apply(proxy)
            time.sleep(max(0.0, over - time.monotonic()))  # pace: the outage lasts until over
            traffic.fault_over(started)
            return proxy.cuts

        try:
            return rpc.run_rpc(name, fault, sizes[size], workdir,
                               plane_env={variable: proxy.through(url)})
        finally:
            proxy.close()

    return run


# -- the delay scheduler: Postgres and Kafka ----------------------------------------------------------
CUT_AT = 0.3  # of the plan's last deadline: chunks are due before, during and after the cut


def _delay_fault(proxy: CuttableProxy, outage: Outage, after_production: bool = False) -> delay.Fault:
    def fault(rig: delay.DelayRig, traffic: delay.DelayTraffic) -> int:
        if after_production:
            traffic.produced_all.wait()
        traffic.at(CUT_AT * traffic.plan.last_due())
        started = time.time()
        over = outage.apply(proxy)
        time.sleep(max(0.0, over - time.monotonic()))  # pace: the outage lasts until over
        traffic.fault_over(started)
        return proxy.cuts

    return fault


def postgres_cut(name: str, outage: Outage, sizes: dict[str, delay.DelaySize],
                 ) -> Callable[[str, Path], Account]:
    """``switchyard delay run`` reaches Postgres through the proxy (the harness's store goes direct)."""

    def run(size: str, workdir: Path) -> Account:
        dsn = Connections.from_env().postgres_dsn
        proxy = CuttableProxy(port_of(dsn))
        try:
            return delay.run_delay(name, _delay_fault(proxy, outage),
                                   sizes[size], workdir,
                                   node_env={"SWITCHYARD_POSTGRES_DSN": proxy.through(dsn)})
        finally:
            proxy.close()

    return run


def kafka_cut(name: str, outage: Outage, sizes: dict[str, delay.DelaySize]) -> Callable[[str, Path], Account]:
    """A private tansu that advertises the proxy: the scheduler's consumer and producer cross it,
    and so do the harness's producer and reader (everything is produced before the cut)."""

    def run(size: str, workdir: Path) -> Account:
        port = free_port()
        proxy = CuttableProxy(port)
        broker = Tansu(port, workdir / "tansu-cut.log", advertised_port=proxy.port)
        broker.start()
        try:
            return delay.run_delay(name, _delay_fault(proxy, outage, after_production=True),
                                   sizes[size], workdir, bootstrap=proxy.address)
        finally:
            proxy.close()
            broker.kill()

    return run


def settled_later(size: delay.DelaySize, outage: Outage) -> delay.DelaySize:
    """The size, waiting out the outage (and a half-open connection's detection) before the account."""
    return replace(size, settle=size.settle + outage.waited())


def waiting_callers(size: rpc.RpcSize, outage: Outage) -> rpc.RpcSize:
    """The size, with callers that wait out the outage (and a half-open connection's detection)."""
    return replace(size, timeout=size.timeout + outage.waited())


OUTAGES = (Outage(Cut.CLOSED, 5.0), Outage(Cut.CLOSED, 60.0), Outage(Cut.HALF_OPEN, HALF_OPEN_S))


def in_ci(outage: Outage) -> bool:
    """The short suite (./dev test) takes the 5 s cuts; 60 s cuts and half-open ones (whose
    detection takes up to two heartbeats or a timeout each) run in ./dev faults only."""
    return outage == OUTAGES[0]


def scenarios(rpc_sizes: dict[str, rpc.RpcSize], delay_sizes: dict[str, delay.DelaySize],
              ) -> list[tuple[str, Callable[[str, Path], Account], bool]]:
    """(name, run, in CI) of every cut: each service, each outage."""
    kafka_sizes = {size: replace(d, produce_every=0.02) for size, d in delay_sizes.items()}  # all before
    found: list[tuple[str, Callable[[str, Path], Account], bool]] = []
    for outage in OUTAGES:
        later = {size: settled_later(d, outage) for size, d in delay_sizes.items()}
        patient = {size: waiting_callers(r, outage) for size, r in rpc_sizes.items()}
        kafka_later = {size: settled_later(d, outage) for size, d in kafka_sizes.items()}
        rpc_name, delay_name = f"rpc: {{}} {outage.label()}", f"delay: {{}} {outage.label()}"
        found += [(rpc_name.format(s), rpc_cut(rpc_name.format(s), s, outage, patient), in_ci(outage))
                  for s in RPC_SERVICES]
        found += [(delay_name.format("Postgres"), postgres_cut(delay_name.format("Postgres"), outage, later),
                   in_ci(outage)),
                  (delay_name.format("Kafka"), kafka_cut(delay_name.format("Kafka"), outage, kafka_later),
                   in_ci(outage))]
    return found
