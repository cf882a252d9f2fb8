"""The pool reconciler: the keyed RPC design's two control loops, one pass per scheduled tick.

Request queues (two-stage shutdown):
- Active, nothing seen for ``unbind_delay``: unbind the queue (new requests become orphans).
- Unbound, nothing seen for ``stop_delay``: if the queue still holds requests, bind it again and
  keep the group; otherwise stop the group, check again that the queue is empty and has no
  consumer (a worker killed mid-request returns its request), and only then delete the queue.
  Quorum queues refuse ``if-empty`` deletes, so emptiness is checked under the key's lock, which
  every code path that binds a queue also holds: nothing can enter between check and delete.
Worker groups: start the groups the state expects and the driver does not run, stop the ones it
runs and the state does not expect; once each, no retries inside a pass, errors logged and counted.
A stopped group stays in the state as Stopped (a tombstone, purged after ``tombstone_s``), so
that late activity cannot start it again.
A lost state (no ``initialized`` marker) is rebuilt from the broker's ``{pool}-req-*`` queues and
the driver's running groups, all marked Active: the normal delays then apply and nothing that
holds work is deleted. Queue names Switchyard would not have made are skipped, logged and counted.
The reconciler sees its collaborators through ``rpc.ports`` only (the pool store, the pool's
request queues, the dead-lettering probe, the driver), so its unit tests run on fakes
(tests/rpc/test_reconciler_unit.py) and its integration tests on a broker.
Broker health: one pass per ``probe_interval_s`` (across every pool on the broker) probes whether
the broker can still start an at-least-once dead-lettering queue (switchyard/rpc/control/dead_lettering.py);
``dead_lettering_stranded`` is the alarm's metric.
A request queue a broker crash left without a leader (switchyard/rpc/control/leaderless.py) is found by its
missing statistics and a probe, then deleted and declared again: ``leaderless_redeclared``; one
whose members' nodes are down is kept, to come back with them: ``leaderless_waiting``.
Queue depths (scaling, the ``QueueDepth`` metric, the leaderless watch) come from one listing of
the management API, which costs the broker about a millisecond per queue of the vhost: with
thousands of queues it is read only every so often (``DepthCadence``), so that it takes at most a
tenth of the time; the other passes step the groups without it (``depths_skipped``), scale
nothing, and report the last listing's depths again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.control.leaderless import LeaderlessWatch, members_away
from switchyard.rpc.ports import (
    DeadLetteringProbe,
    GroupState,
    GroupStatus,
    PoolStore,
    RequestQueues,
    WorkerGroup,
    WorkerGroupDriver,
    now_ms,
)
from switchyard.rpc.settings import Delays


@dataclass
class ReconcileOutcome:
    skipped: int = 0  # another pass held the pool's reconciler lock
    rebuilt_groups: int = 0
    unbound: int = 0
    stopped: int = 0
    queues_deleted: int = 0
    kept_nonempty: int = 0
    waiting_for_consumers: int = 0
    groups_started: int = 0
    groups_stopped: int = 0
    spares_started: int = 0  # warm spares the driver started this pass (``keep_spares``)
    driver_errors: int = 0
    queue_errors: int = 0
    tombstones_purged: int = 0
    foreign_queues: int = 0  # ``{pool}-req-*`` names Switchyard did not make: skipped
    dead_lettering_probes: int = 0
    dead_lettering_stranded: int = 0  # the probe found the broker's dead-letter supervisor gone
    leaderless_redeclared: int = 0  # request queues a broker crash left without a leader
    leaderless_waiting: int = 0  # silent request queues whose members' nodes are down: kept
    depths_skipped: int = 0  # the queue listing was not due this pass (DepthCadence)
    depths: dict[str, int] = field(default_factory=dict)  # worker group id -> messages in its queue


@dataclass
class DepthCadence:
    """When the next queue listing is due: ``share`` of the time at most goes to it.

    A listing that took 2 s is next due 2 / ``share`` s after it started; one of 10 ms (a pool of
    a hundred queues) is due again at once, so small pools read their depths on every pass. Kept
    across passes, like the leaderless watch.
    """

    share: float = 0.1
    clock: Callable[[], float] = time.monotonic
    _next: float = float("-inf")
    # The last listing's depths, reported again by the passes between listings: the QueueDepth
    # alarm counts missing minutes as not breaching, so gaps would keep it from ever firing.
    depths: dict[str, int] = field(default_factory=dict)

    def due(self) -> bool:
        return self.clock() >= self._next

    def listed(self, started: float) -> None:
        """A listing that began at ``started`` (this clock) has just ended."""
        self._next = started + (self.clock() - started) / self.share


class Reconciler:
    def __init__(self, state: PoolStore, queues: RequestQueues, driver: WorkerGroupDriver,
                 delays: Delays, *, probe: DeadLetteringProbe | None = None, probe_interval_s: float = 0.0,
                 leaderless: LeaderlessWatch | None = None, cadence: DepthCadence | None = None) -> None:
        self.state = state
        self.queues = queues
        self.driver = driver
        self.delays = delays
        self.probe = probe
        self.probe_interval_s = probe_interval_s  # 0 (or no probe): not probed
        self.pool = queues.pool
        self.leaderless = leaderless  # None: not watched (its memory must outlive the pass)
        self.cadence = cadence  # None: depths on every pass
        self._revived: set[str] = set()  # groups this pass made Active again (_keep)

    def run_pass(self, at_ms: int | None = None) -> ReconcileOutcome:
        outcome = ReconcileOutcome()
        with self.state.reconciler_turn() as mine:
            if not mine:
                outcome.skipped = 1
                return outcome
            if not self.state.is_initialized():
                self._rebuild(outcome)
            now = at_ms or now_ms()
            groups = self.state.groups(include_stopped=True)
            for group in groups.values():
                try:
                    self._step_queue(group, now, outcome)
                except Exception:  # one group's failure must not stop the pass
                    outcome.queue_errors += 1
                    logger.exception("request queue step failed", extra={"pool": self.pool, "key": group.key})
            running = self._converge_groups(outcome, now, groups)
            self._keep_spares(outcome)
            if self.cadence is None or self.cadence.due():
                started = self.cadence.clock() if self.cadence else 0.0
                queues = self._observe_depths(outcome, running)
                if self.cadence is not None:
                    self.cadence.listed(started)  # a listing that failed counts too: it backs off
                    if queues:
                        self.cadence.depths = dict(outcome.depths)
                self._redeclare_leaderless(queues, outcome)
            else:
                outcome.depths_skipped = 1
                outcome.depths = dict(self.cadence.depths)  # as last listed (no scaling on them)
            self._probe_dead_lettering(outcome)
        return outcome

    def _keep_spares(self, outcome: ReconcileOutcome) -> None:
        """After the groups: a spare the pass's starts claimed is replaced on the same pass."""
        try:
            outcome.spares_started += self.driver.keep_spares(self.pool)
        except Exception:  # the next pass tries again
            outcome.driver_errors += 1
            logger.exception("starting warm spares failed", extra={"pool": self.pool})

    def _probe_dead_lettering(self, outcome: ReconcileOutcome) -> None:
        """Classic-queue pools never dead-letter at least once: nothing to probe for them."""
        probe = self.probe
        if (probe is None or self.probe_interval_s <= 0
                or self.queues.queue_type is not protocol.QueueType.QUORUM):
            return
        if not self.state.probe_turn(probe.broker, self.probe_interval_s):
            return
        try:
            stranded = probe.stranded()
        except Exception:  # observability must not break the pass
            outcome.queue_errors += 1
            logger.exception("dead-lettering probe failed", extra={"pool": self.pool})
            return
        outcome.dead_lettering_probes += 1
        outcome.dead_lettering_stranded += int(stranded)

    # -- request queues -----------------------------------------------------------------------
    def _step_queue(self, group: GroupState, now: int, outcome: ReconcileOutcome) -> None:
        idle_ms = now - max(group.seen_ms, group.since_ms)
        if group.status is GroupStatus.STOPPED:
            if now - group.since_ms >= self.delays.tombstone_s * 1000 and self.state.remove(group):
                outcome.tombstones_purged += 1
        elif group.status is GroupStatus.ACTIVE and idle_ms >= self.delays.unbind_s * 1000:
            with self.state.locked([group.key]):
                if self.state.set_status(group, GroupStatus.UNBOUND, now):
                    self.queues.unbind_request_queue(group.key)
                    outcome.unbound += 1
                    logger.info("request queue unbound", extra={"pool": self.pool, "key": group.key})
        elif group.status is GroupStatus.UNBOUND and idle_ms >= self.delays.stop_s * 1000:
            with self.state.locked([group.key]):
                self._stop_group(group, outcome)

    def _stop_group(self, group: GroupState, outcome: ReconcileOutcome) -> None:
        """Under the key's lock: stop the group and delete its queue, unless work is waiting."""
        current = self.state.get(group.key)
        if current is None or current.raw != group.raw:
            return  # an orphan or activity arrived: the group lives on
        queue = protocol.request_queue(self.pool, group.key)
        if self._holds_work(group, queue, outcome):
            return
        wg = WorkerGroup(self.pool, group.key)
        self.driver.stop(wg)
        outcome.stopped += 1
        status = self.queues.queue_status(queue)
        if status is not None:
            messages, consumers = status
            if consumers:
                outcome.waiting_for_consumers += 1  # workers still draining (ECS): next pass
                return
            if messages:
                self._keep(group, queue, outcome)  # a stopped worker handed a request back
                return
            self.queues.delete_request_queue(group.key)
            outcome.queues_deleted += 1
        self.state.set_status(group, GroupStatus.STOPPED)
        logger.info("worker group stopped and request queue deleted",
                    extra={"pool": self.pool, "key": group.key})

    def _holds_work(self, group: GroupState, queue: str, outcome: ReconcileOutcome) -> bool:
        status = self.queues.queue_status(queue)
        if status is not None and status[0] > 0:
            self._keep(group, queue, outcome)
            return True
        return False

    def _keep(self, group: GroupState, queue: str, outcome: ReconcileOutcome) -> None:
        """Work is waiting in an unbound queue: serve it (bind, Active) rather than drop it."""
        self.state.touch([group.key])
        self._revived.add(group.key)
        self.queues.ensure_request_queue(group.key)
        outcome.kept_nonempty += 1
        logger.warning("unbound queue still holds requests: bound again", extra={"pool": self.pool,
                                                                                  "queue": queue})

    # -- worker groups --------------------------------------------------------------------------
    def _expected(self, group: GroupState, now: int) -> bool:
        """Active groups, and Unbound ones still inside STOP_DELAY (their workers drain the queue).

        An Unbound group past STOP_DELAY is being stopped: ``_stop_group`` may have stopped its
        workers and be waiting for the broker to drop their consumers before deleting the queue.
        Starting it again here would undo that stop on every pass, and the group would stay up,
        Unbound, for ever. If its queue still holds work, ``_keep`` makes it Active again.
        """
        if group.status is GroupStatus.STOPPED:
            return False
        idle_ms = now - max(group.seen_ms, group.since_ms)
        return group.status is GroupStatus.ACTIVE or idle_ms < self.delays.stop_s * 1000

    def _converge_groups(self, outcome: ReconcileOutcome, now: int,
                         groups: dict[str, GroupState]) -> set[str]:
        """Start missing groups, stop extra ones; returns the keys running afterwards.

        ``groups`` is the state read at the start of the pass. Only what can make it stale matters:
        a group that became Active since (an orphan, activity, this pass's ``_keep``) and whose
        workers the driver already lists. So the groups the listing shows running and that read
        says should not run, and those ``_keep`` made Active, are read again (one ``HMGET``): the
        whole hash is read once a pass, not twice (10,000 groups: about 1 MB and 10,000 JSON
        decodes each time).
        """
        try:
            running = self.driver.list_running(self.pool)
        except Exception:  # the keyed RPC design: log and continue to the next iteration
            outcome.driver_errors += 1
            logger.exception("listing running worker groups failed", extra={"pool": self.pool})
            return set()
        expected = {key for key, group in groups.items() if self._expected(group, now)}
        stale = (running - expected) | self._revived  # may have become Active after the first read
        if stale:
            fresh = self.state.get_many(stale)
            expected |= {key for key, group in fresh.items() if self._expected(group, now)}
        now_running = set(running)
        for key in expected - running:
            try:
                self.driver.start(WorkerGroup(self.pool, key))
                outcome.groups_started += 1
                now_running.add(key)
            except Exception:  # no retries inside a pass; the next pass tries again
                outcome.driver_errors += 1
                logger.exception("worker group start failed", extra={"pool": self.pool, "key": key})
        for key in running - expected:
            try:
                self.driver.stop(WorkerGroup(self.pool, key))
                outcome.groups_stopped += 1
                now_running.discard(key)
            except Exception:
                outcome.driver_errors += 1
                logger.exception("worker group stop failed", extra={"pool": self.pool, "key": key})
        return now_running

    def _request_queues(self, outcome: ReconcileOutcome) -> list[tuple[str, dict]]:
        """``(key, queue)`` for every request queue of the pool; foreign names skipped and counted."""
        queues = self.queues.list_request_queues(columns="name,messages,arguments,members,online,state")
        found = []
        for queue in queues:
            key = protocol.key_from_request_queue(self.pool, queue["name"], queue.get("arguments"))
            if key is None:
                outcome.foreign_queues += 1
                logger.warning("queue under the pool's request prefix is not Switchyard's: skipped",
                               extra={"pool": self.pool, "queue": queue["name"]})
                continue
            found.append((key, queue))
        return found

    def _observe_depths(self, outcome: ReconcileOutcome, running: set[str]) -> list[tuple[str, dict]]:
        """Queue depth per group: a metric (Amazon MQ 4.x sends none) and the autoscaling input.
        Returns the queues read (none if reading failed)."""
        try:
            queues = self._request_queues(outcome)
        except Exception:  # observability must not break the pass
            outcome.queue_errors += 1
            logger.exception("reading queue depths failed", extra={"pool": self.pool})
            return []
        for key, queue in queues:
            depth = int(queue.get("messages") or 0)
            wg = WorkerGroup(self.pool, key)
            outcome.depths[wg.group_id] = depth
            if key in running:
                try:
                    self.driver.scale(wg, depth)
                except Exception:
                    outcome.driver_errors += 1
                    logger.exception("scaling failed", extra={"pool": self.pool, "key": key})
        return queues

    def _redeclare_leaderless(self, queues: list[tuple[str, dict]], outcome: ReconcileOutcome) -> None:
        """Delete and declare again each request queue that stays silent and does not answer a probe."""
        if self.leaderless is None or self.queues.queue_type is not protocol.QueueType.QUORUM:
            return
        listed = dict(queues)
        for key in self.leaderless.suspects(queues):
            queue = protocol.request_queue(self.pool, key)
            away = members_away(listed[key])
            if away:
                self.leaderless.cleared(key)  # asked again after another silent window
                outcome.leaderless_waiting += 1
                logger.warning("request queue has no leader while nodes of its members are down: kept, "
                               "it comes back with them",
                               extra={"pool": self.pool, "queue": queue, "nodes": away})
                continue
            self._redeclare(self.leaderless, key, queue, outcome)

    def _redeclare(self, watch: LeaderlessWatch, key: str, queue: str, outcome: ReconcileOutcome) -> None:
        """Probe one silent queue; if the broker does not answer, delete it and declare it again."""
        try:
            if self.queues.answers_consume(queue, watch.probe_timeout_s):
                watch.cleared(key)
                return
            # Not under the key's lock: the orphan handler holds it while its publish to this
            # very queue is blocked, until the delete frees it. Nothing it could do meanwhile
            # matters: the queue's messages are gone, and a bind lost to the race sends the
            # next requests to the orphan handler, which binds the queue again.
            group = self.state.get(key)
            self.queues.delete_request_queue(key)
            self.queues.ensure_request_queue(
                key, bind=group is not None and group.status is GroupStatus.ACTIVE)
        except Exception:  # the next pass tries again
            outcome.queue_errors += 1
            logger.exception("declaring a leaderless request queue again failed",
                             extra={"pool": self.pool, "queue": queue})
            return
        watch.cleared(key)
        outcome.leaderless_redeclared += 1
        logger.error("request queue had no leader after a broker crash: deleted and declared again "
                     "(its messages were lost with the member; callers time out and may retry)",
                     extra={"pool": self.pool, "queue": queue})

    # -- lost state ---------------------------------------------------------------------------
    def _rebuild(self, outcome: ReconcileOutcome) -> None:
        keys = {key for key, _ in self._request_queues(outcome)}
        try:
            keys |= self.driver.list_running(self.pool)
        except Exception:
            outcome.driver_errors += 1
            logger.exception("listing running groups during rebuild failed", extra={"pool": self.pool})
        if keys:
            with self.state.locked(keys):
                self.state.touch(keys)
                self.queues.ensure_request_queues(keys)
        self.state.mark_initialized()
        outcome.rebuilt_groups = len(keys)
        if keys:  # state was lost while groups existed: worth a look (why did Redis lose it?)
            logger.warning("pool state rebuilt from the broker and the driver",
                           extra={"pool": self.pool, "groups": len(keys)})
        else:  # a new pool (or one with nothing left): nothing was lost, nothing to act on
            logger.info("pool state initialized (no groups to rebuild)", extra={"pool": self.pool})
