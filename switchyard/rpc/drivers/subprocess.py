"""Worker groups as local subprocesses (keyed RPC's subprocess driver), for the local runtime and tests.

The driver lives inside the local runtime process and keeps its children in memory: a restart of
the runtime forgets them (``close()`` stops them first). Each worker runs the configured command
with the runtime's environment (as it was when the driver was made, plus the driver's ``env``), the
worker protocol's variables and a unique ``WORKER_ID``; its stdout and stderr go to
``{log_dir}/{group_id}.log``, never to a pipe nobody reads (a full pipe would freeze the worker).

Thread-safe: the reconciler and the orphan handler may call it from different threads. The lock
is held to change the table of processes, never while waiting for workers to exit.

Warm spares (``min_spares`` with a ``SpareRegistry``): the driver keeps that many workers of its
pool started with ``WORKER_SPARE=1`` and no key (``worker/spare.py``). Starting a group with no live
worker first claims one of its own spares that registered as ready (claim_spare.lua, atomic: a
spare goes to one key only, across control planes); the claimed process becomes the group's
worker. No spare ready, or Redis failing: the group starts as without spares. New spares are
started in the background, by one thread, one at a time (each once the one before registered or
exited): a burst of new keys that takes many spares is not slowed by as many imports at once on
the cores serving it. Each start and each ``list_running`` (every reconciler pass) wakes it; it
forgets dead spares and starts new ones up to ``min_spares``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from switchyard.core.errors import ConfigError
from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.errors import DriverError
from switchyard.rpc.ports import (
    WorkerGroup,
    WorkerGroupDriver,
    check_sizes,
    desired_workers,
)
from switchyard.rpc.settings import DEFAULT_WORKER_LOG_DIR
from switchyard.rpc.spares import SPARE_ENV, SpareRegistry
from switchyard.rpc.worker.examples import INTENDED_CRASH_EXIT

DEFAULT_LOG_DIR = Path(DEFAULT_WORKER_LOG_DIR)
SPARE_READY_S = 30.0  # the longest the refiller waits for a new spare to register before the next
SPARE_POLL_S = 0.02  # between its looks (a SISMEMBER each)


@dataclass(frozen=True, slots=True)
class WorkerProcess:
    """One running worker: its id (``WORKER_ID``) and process."""

    worker_id: str
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid


class SubprocessDriver(WorkerGroupDriver):
    """Runs ``command`` once per worker, between ``min_workers`` and ``max_workers`` per group.

    ``env``: variables for every worker on top of this process's environment, never instead of it:
    a worker needs what the runtime was configured with (the broker's URL, ``PYTHONPATH``, the
    trace log the runtime's hops go to) as much as its own settings.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        min_workers: int = 1,
        max_workers: int = 4,
        target_backlog: int = 10,
        log_dir: Path | str = DEFAULT_LOG_DIR,
        stop_timeout: float = 15.0,
        env: Mapping[str, str] | None = None,
        min_spares: int = 0,
        spares: SpareRegistry | None = None,
    ) -> None:
        if not command:
            raise ConfigError("the worker command is empty")
        check_sizes(min_workers, max_workers, target_backlog)
        self.command = tuple(command)
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.target_backlog = target_backlog
        self.log_dir = Path(log_dir)
        self.stop_timeout = stop_timeout
        self._base_env = {**os.environ, **(env or {})}
        self._groups: dict[WorkerGroup, list[WorkerProcess]] = {}
        self._lock = threading.Lock()
        if min_spares < 0 or (min_spares and spares is None):
            raise ConfigError("min_spares must be 0, or at least 1 with a spare registry (the pool's Redis)")
        self.min_spares = min_spares
        self.spares = spares
        self._spares: list[WorkerProcess] = []  # started as spares, not claimed yet (oldest first)
        self._refill = threading.Event()
        self._closed = False
        self._refiller: threading.Thread | None = None

    # -- contract ---------------------------------------------------------------------------
    def start(self, group: WorkerGroup) -> None:
        with self._lock:
            live = self._reap(group)
            if not live and self._adopt(group):
                live = self._groups[group]
            for _ in range(self.min_workers - len(live)):
                self._spawn(group)
        self._wake_refiller()

    def stop(self, group: WorkerGroup) -> None:
        with self._lock:
            procs = self._groups.pop(group, [])
        if procs:
            logger.info("stopping worker group", extra={"group_id": group.group_id, "workers": len(procs)})
        self._terminate_and_wait(procs)

    def list_running(self, pool: str) -> set[str]:
        self._wake_refiller()
        with self._lock:
            groups = [group for group in self._groups if group.pool == pool]
            return {group.key for group in groups if self._reap(group)}

    def worker_count(self, group: WorkerGroup) -> int:
        with self._lock:
            return len(self._reap(group))

    def workers(self, group: WorkerGroup) -> list[WorkerProcess]:
        """The group's live workers, oldest first (for inspection and tests)."""
        with self._lock:
            return list(self._reap(group))

    def scale(self, group: WorkerGroup, backlog: int) -> int:
        """Start or stop workers so the group runs ``clamp(ceil(backlog / target), min, max)``.

        Scaling down sends SIGTERM to the newest workers; each finishes its request in hand.
        A group that is not running is started at the wanted size.
        """
        wanted = desired_workers(backlog, min_workers=self.min_workers, max_workers=self.max_workers,
                                 target_backlog=self.target_backlog)
        with self._lock:
            live = self._reap(group)
            surplus: list[WorkerProcess] = []
            if len(live) < wanted:
                for _ in range(wanted - len(live)):
                    self._spawn(group)
            elif len(live) > wanted:
                surplus = live[wanted:]
                self._groups[group] = live[:wanted]
        if surplus:
            logger.info("scaling worker group down", extra={"group_id": group.group_id,
                                                            "workers": wanted, "stopping": len(surplus)})
        self._terminate_and_wait(surplus)
        return wanted

    def close(self) -> None:
        """Stop every worker of every group (terminate all first, then wait once)."""
        self._closed = True
        self._refill.set()
        if self._refiller is not None:
            self._refiller.join(SPARE_READY_S + 1)
        with self._lock:
            procs = [proc for group_procs in self._groups.values() for proc in group_procs]
            spares, self._spares = self._spares, []
            self._groups.clear()
        self._terminate_and_wait(procs + spares)
        for spare in spares:
            self._forget_spare(spare)

    def waiting_spares(self) -> list[WorkerProcess]:
        """The spares started and not claimed yet, alive (for inspection and tests)."""
        with self._lock:
            return [proc for proc in self._spares if proc.process.poll() is None]

    # -- internals (call with the lock held) ------------------------------------------------
    def _reap(self, group: WorkerGroup) -> list[WorkerProcess]:
        """Drop exited workers; a group with none left is forgotten so the control loop restarts it."""
        procs = self._groups.get(group)
        if procs is None:
            return []
        live = []
        for proc in procs:
            code = proc.process.poll()
            if code is None:
                live.append(proc)
            elif code == INTENDED_CRASH_EXIT:  # examples.crash: a poison request doing its job
                logger.info("worker exited: the handler's intended crash (examples.crash, a poison request)",
                            extra={"group_id": group.group_id, "worker_id": proc.worker_id,
                                   "returncode": code})
            else:
                logger.warning("worker exited", extra={"group_id": group.group_id,
                                                       "worker_id": proc.worker_id, "returncode": code})
        if live:
            self._groups[group] = live
        else:
            del self._groups[group]
        return live

    def _adopt(self, group: WorkerGroup) -> bool:
        """Hand the group's key to one of this driver's ready spares; whether one took it."""
        if self.spares is None or group.pool != self.spares.pool:
            return False
        for proc in list(self._spares):
            if proc.process.poll() is not None:
                continue  # dead: forgotten by the next top-up
            try:
                claimed = self.spares.claim(proc.worker_id, group.key)
            except redis.RedisError:
                logger.warning("claiming a spare failed; starting a worker",
                               extra={"group_id": group.group_id})
                return False
            if claimed:
                self._spares.remove(proc)
                self._groups.setdefault(group, []).append(proc)
                logger.info("spare adopted a group", extra={"group_id": group.group_id,
                                                            "worker_id": proc.worker_id, "pid": proc.pid})
                return True
        return False

    def _wake_refiller(self) -> None:
        if self.spares is None or self._closed:
            return
        self._refill.set()
        if self._refiller is None:
            with self._lock:
                if self._refiller is None:
                    self._refiller = threading.Thread(target=self._refill_loop, daemon=True,
                                                      name=f"spares-{self.spares.pool}")
                    self._refiller.start()

    def _refill_loop(self) -> None:
        """Forget dead spares; start new ones up to ``min_spares``, one at a time."""
        while not self._closed:
            self._refill.wait()
            self._refill.clear()
            while not self._closed:
                with self._lock:
                    self._forget_dead_spares()
                    if len(self._spares) >= self.min_spares:
                        break
                    try:
                        proc = self._spawn_spare()
                    except DriverError:
                        logger.exception("starting a spare failed; the next pass tries again")
                        break
                self._wait_registered(proc)

    def _forget_dead_spares(self) -> None:
        for proc in [p for p in self._spares if p.process.poll() is not None]:
            self._spares.remove(proc)
            logger.warning("spare exited", extra={"worker_id": proc.worker_id,
                                                  "returncode": proc.process.returncode})
            self._forget_spare(proc)

    def _spawn_spare(self) -> WorkerProcess:
        assert self.spares is not None
        pool = self.spares.pool
        worker_id = f"{pool}-spare-{uuid.uuid4().hex[:8]}"
        env = {"WORKER_ID": worker_id, "WORKER_POOL": pool, SPARE_ENV: "1",
               "WORKER_ACTIVITY_EXCHANGE": protocol.activity_exchange(pool)}
        proc = self._popen(worker_id, env, f"{pool}-spares", pool)
        self._spares.append(proc)
        return proc

    def _wait_registered(self, proc: WorkerProcess) -> None:
        """Until the new spare registered, exited or was claimed, for ``SPARE_READY_S`` at most."""
        assert self.spares is not None
        deadline = time.monotonic() + SPARE_READY_S
        while not self._closed and time.monotonic() < deadline and proc.process.poll() is None:
            try:
                if self.spares.is_waiting(proc.worker_id):
                    return
            except redis.RedisError:
                return
            with self._lock:
                if proc not in self._spares:
                    return  # claimed already
            time.sleep(SPARE_POLL_S)

    def _forget_spare(self, proc: WorkerProcess) -> None:
        if self.spares is not None:
            try:
                self.spares.forget(proc.worker_id)
            except redis.RedisError:  # a claim of it finds a dead group: the reconciler starts it
                logger.warning("forgetting a spare failed", extra={"worker_id": proc.worker_id})

    def _spawn(self, group: WorkerGroup) -> WorkerProcess:
        worker_id = f"{group.group_id}-{uuid.uuid4().hex[:8]}"
        proc = self._popen(worker_id, group.environment(worker_id), group.group_id, group.group_id)
        self._groups.setdefault(group, []).append(proc)
        return proc

    def _popen(self, worker_id: str, variables: Mapping[str, str], log_name: str, what: str) -> WorkerProcess:
        env = {**self._base_env, **variables, "PYTHONUNBUFFERED": "1"}
        if SPARE_ENV not in variables:
            env.pop(SPARE_ENV, None)
        log_path = self.log_dir / f"{log_name}.log"
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            # The child keeps its own copy of the descriptor; the parent's is closed at once.
            with open(log_path, "ab") as log:
                process = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            raise DriverError(f"cannot start a worker for {what} with {self.command!r}: {exc}") from exc
        logger.info("worker started", extra={"group_id": what, "worker_id": worker_id,
                                             "pid": process.pid, "log": str(log_path)})
        return WorkerProcess(worker_id, process)

    # -- stopping (without the lock) --------------------------------------------------------
    def _terminate_and_wait(self, procs: Sequence[WorkerProcess]) -> None:
        """SIGTERM all, wait up to ``stop_timeout`` for all together, then SIGKILL the stragglers."""
        for proc in procs:
            if proc.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # exited between poll and kill
                    proc.process.terminate()
        deadline = time.monotonic() + self.stop_timeout
        for proc in procs:
            try:
                proc.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("worker ignored SIGTERM; killing it", extra={"worker_id": proc.worker_id})
                proc.process.kill()
                proc.process.wait()
