"""The control plane of one pool: the four handlers' logic wired to its state, broker and driver.

Composition, as every part's: ``build_service(settings, rpc)`` makes the plane from settings
its caller has read, and ``build_relay`` the scheduled-call relay; nothing here reads the
environment. The adapters call them: the Lambda handlers of ``functions/`` through
``switchyard.aws.services`` (one instance per execution environment, connections reused across
invocations), the local runtime with its own in-process subprocess driver, installed there so the
very same handler functions use it. AMQP connections are leased to one caller at a time (pika's
are not thread-safe); Redis and the driver are shared.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from switchyard.core.redis_client import RedisClient, connect_redis
from switchyard.delay.model import Drop, InputRecord
from switchyard.rpc.control.activity import ActivityOutcome, track_activity
from switchyard.rpc.control.dead_letters import DeadLetterOutcome, respond_dead_letters
from switchyard.rpc.control.leaderless import LeaderlessWatch
from switchyard.rpc.control.orphans import OrphanOutcome, forward_orphans
from switchyard.rpc.control.publisher import ConfirmingPublisher, Outgoing
from switchyard.rpc.control.reconciler import DepthCadence, ReconcileOutcome, Reconciler
from switchyard.rpc.control.rmq_event import AmqpMessage
from switchyard.rpc.control.scheduled import ParkedStore, ScheduledOutcome, relay_scheduled
from switchyard.rpc.control.topology import BrokerProbe, PoolTopology
from switchyard.rpc.drivers import WorkerGroupDriver, driver_from_env
from switchyard.rpc.ports import now_ms
from switchyard.rpc.settings import ControlSettings, RpcSettings
from switchyard.rpc.store import PoolState


class ControlPlane:
    def __init__(self, control: ControlSettings, settings: RpcSettings | None = None,
                 driver: WorkerGroupDriver | None = None, redis_client: RedisClient | None = None) -> None:
        self.control = control
        self.pool = control.pool
        self.settings = settings or RpcSettings.from_env()
        self.driver = driver or driver_from_env()
        self.redis = redis_client or connect_redis(self.settings.connections)
        self.state = PoolState(self.redis, self.pool)
        # pika connections are not thread-safe, and the Lambda runtime (or the local bridge) may
        # call each handler from a new thread: connections are leased, one user at a time.
        self._idle: list[tuple[PoolTopology, ConfirmingPublisher]] = []
        self._all: list[tuple[PoolTopology, ConfirmingPublisher]] = []
        self._lease_lock = threading.Lock()
        self.leaderless = LeaderlessWatch()  # outlives each pass (and a warm Lambda invocation)
        self.depth_cadence = DepthCadence()  # likewise

    @contextmanager
    def _lease(self) -> Iterator[tuple[PoolTopology, ConfirmingPublisher]]:
        with self._lease_lock:
            pair = self._idle.pop() if self._idle else None
        if pair is None:
            url = self.settings.connections.amqp_url
            pair = (PoolTopology(self.pool, self.settings),
                    ConfirmingPublisher(url, f"switchyard-control-{self.pool}"))
            with self._lease_lock:
                self._all.append(pair)
        pair[0].refresh()
        try:
            yield pair
        finally:
            with self._lease_lock:
                self._idle.append(pair)

    def forward_orphans(self, messages: Iterable[AmqpMessage]) -> OrphanOutcome:
        with self._lease() as (topology, publisher):
            return forward_orphans(messages, state=self.state, topology=topology,
                                   publisher=publisher, driver=self.driver)

    def respond_dead_letters(self, messages: Iterable[AmqpMessage]) -> DeadLetterOutcome:
        with self._lease() as (_, publisher):
            return respond_dead_letters(messages, pool=self.pool, publisher=publisher)

    def track_activity(self, messages: Iterable[AmqpMessage]) -> ActivityOutcome:
        with self._lease() as (topology, _):
            return track_activity(messages, state=self.state, topology=topology)

    def reconcile(self) -> ReconcileOutcome:
        with self._lease() as (topology, _):
            probe = BrokerProbe(topology, self.control.probe_settings(topology.settings))
            return Reconciler(self.state, topology, self.driver, self.control.delays, probe=probe,
                              probe_interval_s=self.control.dead_letter_probe_interval_s,
                              leaderless=self.leaderless, cadence=self.depth_cadence).run_pass()

    def close(self) -> None:
        """Close every connection this plane opened and the driver (which stops local workers).

        Call it once the threads using the plane have stopped.
        """
        with self._lease_lock:
            pairs, self._all, self._idle = self._all, [], []
        for topology, publisher in pairs:
            topology.close()
            publisher.close()
        self.driver.close()


def build_service(settings: ControlSettings, rpc: RpcSettings, *, driver: WorkerGroupDriver,
                  redis_client: RedisClient | None = None) -> ControlPlane:
    """The control plane of ``settings.pool`` on the broker and Redis of ``rpc`` (connected on first
    use), starting its worker groups with ``driver`` (the adapter's: ``drivers.driver_from_env``)."""
    return ControlPlane(settings, rpc, driver, redis_client)


def build_relay(settings: RpcSettings, parked: ParkedStore) -> ScheduledRelay:
    """The scheduled-call relay of a process; ``parked``: the delay store's ``parked_messages``."""
    return ScheduledRelay(settings, parked)


class ScheduledRelay:
    """The scheduled-call relay of a process: one confirming publisher (every pool's request exchange)
    and the delay store's ``parked_messages`` for records no pool takes. Not thread-safe: one event
    source calls it."""

    KNOWN_FOR_S = 30.0  # a pool seen is not checked again for this long (a deleted one: refused later)

    def __init__(self, settings: RpcSettings, parked: ParkedStore) -> None:
        self.settings = settings
        self.parked = parked
        self.publisher = ConfirmingPublisher(self.settings.connections.amqp_url, "switchyard-scheduled")
        self._known: dict[str, float] = {}  # request exchange -> when it was last seen

    def relay(self, records: Iterable[InputRecord | Drop]) -> ScheduledOutcome:
        return relay_scheduled(records, publisher=self, parked=self.parked, now_ms=now_ms())

    def publish_settled(self, messages: list[Outgoing], timeout: float = 30.0) -> list[str | None]:
        return self.publisher.publish_settled(messages, timeout)

    def frame_max(self) -> int:
        return self.publisher.frame_max()

    def exchange_exists(self, exchange: str) -> bool:
        """The publisher's check, remembered for ``KNOWN_FOR_S`` when the exchange exists."""
        seen = self._known.get(exchange)
        if seen is not None and time.monotonic() - seen < self.KNOWN_FOR_S:
            return True
        exists = self.publisher.exchange_exists(exchange)
        if exists:
            self._known[exchange] = time.monotonic()
        return exists

    def close(self) -> None:
        self.publisher.close()
