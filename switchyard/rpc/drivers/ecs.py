"""Worker groups as ECS tasks (the keyed RPC design's ECS driver): ``SWITCHYARD_RPC_DRIVER=ecs`` on AWS.

Each worker is one Fargate task of the pool's task definition, started with ``RunTask``:

* ``startedBy`` is the group id (``{pool}-{digest}``), so ``ListTasks(startedBy=...)`` finds a
  group's tasks in one call;
* tags carry the pool and the raw key (base64url, split over ``switchyard:key:N`` tags because a
  tag value holds at most 256 characters of a restricted set), so ``list_running`` can rebuild
  the keys of a pool from ECS alone;
* the container override sets the worker protocol's environment (``WORKER_ID``, ``WORKER_KEY``...).

Why ``RunTask`` and not one ECS service per group: a task starts in one API call (a service
needs ``CreateService``, a deployment and then the scheduler's placement, and must be deleted
and drained before its name can be reused), scaling is ``RunTask``/``StopTask`` of exactly the
tasks we pick, and an account has a service quota per cluster that a pool with many keys would
reach. What a service would give for free, restarting a crashed task, the reconciler already
does: a group with no live task is missing from ``list_running`` and is started on the next pass.

Stopping is ECS's two-stage stop: ``StopTask`` sends SIGTERM (the worker finishes its request in
hand and exits), and ECS sends SIGKILL only after the container's ``stopTimeout`` (set in the
task definition, up to 120 s on Fargate). The driver does not wait for that: a Lambda must not.

Concurrency: the reconciler and the orphan handler run in different Lambda environments and may
start the same group at once. Every change of a group runs under a Redis lock per group
(``store.WorkerGroupLock``: the store's one Redis lock, ``SET NX PX`` with a token, released by
compare-and-delete), and ``RunTask`` carries a
``clientToken`` derived from the group and the tasks seen, so two callers that saw the same state
(a lock that expired mid-call, ``ListTasks`` lagging a fresh ``RunTask``) make one request in ECS's eyes.

Scaling at many groups: the reconciler asks every pass for each running group's size. ``scale``
answers from the listing ``list_running`` made in the same pass (one paginated ``ListTasks`` for
the pool and a ``DescribeTasks`` per 100 tasks) when the group already has the size it wants, and
calls ECS (under the group's lock) only to change it: two calls per group per pass would be 20,000
a minute at 10,000 groups, far above ECS's API rate.

Warm spares (``min_spares`` with a ``SpareRegistry``, issue 40): tasks of the pool's task definition
started with ``WORKER_SPARE=1`` and no key (``worker/spare.py``), ``startedBy`` ``{pool}-spares``
and tagged ``switchyard:spare``. Starting a group with no live task first claims one that
registered as ready (claim_spare.lua, atomic across control planes: a spare goes to one key only),
then tags it with the group and the key, so ``list_running``, ``scale`` and ``stop`` treat it as
the group's task; no spare ready: ``RunTask`` as without spares. A Lambda keeps no thread, so the
reconciler tops the spares up on each pass (``keep_spares``): the spares counted are the pool's
spare tasks ECS wants running and no key adopted (registered or still starting), so a pass after a
pass launches nothing more; they count against ``max_tasks`` (all the pool's tasks) and run on the
pool's capacity provider, Spot included. A claim whose tagging fails stops that task (it finishes
the request in hand) and starts the group with ``RunTask``: an untagged task would serve the key
out of the driver's sight.

Failures: the boto3 client uses the standard retry mode (throttling and 5xx are retried with
backoff); what still fails raises ``DriverError``, which the callers count (the reconciler's
``driver_errors``, the orphan handler's ``group_start_failures``) and retry on their next pass.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from switchyard.core.config import build
from switchyard.core.errors import ConfigError
from switchyard.core.observability import logger
from switchyard.rpc import protocol
from switchyard.rpc.errors import DriverError
from switchyard.rpc.ports import (
    GroupLock,
    WorkerGroup,
    WorkerGroupDriver,
    check_sizes,
    desired_workers,
)
from switchyard.rpc.settings import (
    ECS_CAPACITY_PROVIDER,
    ECS_CLUSTER,
    ECS_CONTAINER,
    ECS_MAX_TASKS,
    ECS_SECURITY_GROUPS,
    ECS_SUBNETS,
    ECS_TASK_DEFINITION,
)
from switchyard.rpc.spares import SPARE_ENV, SpareRegistry

TAG_POOL = "switchyard:pool"
TAG_GROUP = "switchyard:group"
TAG_SPARE = "switchyard:spare"  # a task started as a warm spare; its worker id
TAG_KEY = "switchyard:key"  # switchyard:key:0, switchyard:key:1, ... (base64url of the UTF-8 key)
TAG_VALUE_CHARS = 256
MAX_KEY_TAGS = 40  # ECS allows 50 tags per task; the rest are the pool, the group and spares
DESCRIBE_TASKS_MAX = 100
LISTING_TRUSTED_S = 10.0  # scale() trusts list_running's listing this long (the rest of its pass)
DEFAULT_CONTAINER = ECS_CONTAINER.default
DEFAULT_TASK_DEFINITION = ECS_TASK_DEFINITION.default
# The capacity providers a pool may run its workers on (the deployment associates every one of them
# with the cluster: RunTask may only name associated providers). FARGATE_SPOT costs ~70% less and
# may interrupt a task with two minutes' warning: a worker group is restartable (the reconciler
# starts a group with no live task on its next pass, and an interrupted request is redelivered).
CAPACITY_PROVIDERS = ("FARGATE", "FARGATE_SPOT")
DEFAULT_CAPACITY_PROVIDER = ECS_CAPACITY_PROVIDER.default


@dataclass(frozen=True)
class EcsSettings:
    """Where the driver runs tasks: cluster, task definition family per pool, network."""

    cluster: str
    subnets: tuple[str, ...]
    security_groups: tuple[str, ...]
    # A family (or family:revision, or ARN); ``{pool}`` is replaced by the group's pool.
    task_definition: str = DEFAULT_TASK_DEFINITION
    container: str = DEFAULT_CONTAINER
    capacity_provider: str = DEFAULT_CAPACITY_PROVIDER
    max_tasks: int = 0  # the pool's tasks at most before a spare starts (0: no cap)
    lock_ttl_s: float = 30.0
    lock_wait_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.cluster:
            raise ConfigError(f"{ECS_CLUSTER.name} must name the ECS cluster of the worker tasks")
        if not self.subnets:
            raise ConfigError(f"{ECS_SUBNETS.name} must list the worker tasks' subnets (comma-separated)")
        if not self.security_groups:
            raise ConfigError(f"{ECS_SECURITY_GROUPS.name} must list the worker tasks' security groups")
        if self.capacity_provider not in CAPACITY_PROVIDERS:
            raise ConfigError(f"{ECS_CAPACITY_PROVIDER.name} must be one of "
                              f"{', '.join(CAPACITY_PROVIDERS)}, got {self.capacity_provider!r}")
        if self.max_tasks < 0:
            raise ConfigError(f"{ECS_MAX_TASKS.name} must be 0 (no cap) or more")

    @classmethod
    def from_env(cls, source: Mapping[str, str] | None = None) -> EcsSettings:
        """The ECS driver's settings (``SWITCHYARD_RPC_ECS_*``)."""
        spec = {"cluster": ECS_CLUSTER, "subnets": ECS_SUBNETS, "security_groups": ECS_SECURITY_GROUPS,
                "task_definition": ECS_TASK_DEFINITION, "container": ECS_CONTAINER,
                "capacity_provider": ECS_CAPACITY_PROVIDER, "max_tasks": ECS_MAX_TASKS}
        return build(cls, spec, source)

    def task_definition_for(self, pool: str) -> str:
        return self.task_definition.replace("{pool}", pool)

    def family_for(self, pool: str) -> str:
        """The family part of the task definition (ListTasks filters by family, not revision)."""
        name = self.task_definition_for(pool).rsplit("/", 1)[-1]
        return name.split(":", 1)[0]


def key_tags(key: str) -> list[dict[str, str]]:
    """The key as base64url chunks in ``switchyard:key:N`` tags (tag values allow ``A-Za-z0-9 _.:/=+-@``)."""
    encoded = base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii")
    chunks = [encoded[i:i + TAG_VALUE_CHARS] for i in range(0, len(encoded), TAG_VALUE_CHARS)] or [""]
    if len(chunks) > MAX_KEY_TAGS:
        raise DriverError(f"key of {len(key.encode())} bytes is too long to tag an ECS task "
                          f"(at most {MAX_KEY_TAGS * TAG_VALUE_CHARS * 3 // 4} bytes)")
    return [{"key": f"{TAG_KEY}:{i}", "value": chunk} for i, chunk in enumerate(chunks)]


def key_from_tags(tags: Sequence[dict[str, str]]) -> str | None:
    """The raw key of a task tagged by ``key_tags``; None when absent or damaged."""
    parts: dict[int, str] = {}
    for tag in tags:
        name = tag.get("key", "")
        if name.startswith(TAG_KEY + ":"):
            try:
                parts[int(name[len(TAG_KEY) + 1:])] = tag.get("value", "")
            except ValueError:
                return None
    if not parts or sorted(parts) != list(range(len(parts))):
        return None
    try:
        return base64.urlsafe_b64decode("".join(parts[i] for i in range(len(parts)))).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def ecs_client(endpoint_url: str | None = None) -> Any:
    """An ECS client with the standard retry mode (throttles and 5xx retried with backoff)."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=20)
    return boto3.client("ecs", endpoint_url=endpoint_url, config=config)


class EcsDriver(WorkerGroupDriver):
    """Runs each worker as an ECS task; between ``min_workers`` and ``max_workers`` per group."""

    def __init__(
        self,
        settings: EcsSettings,
        *,
        lock: GroupLock,
        client: Any = None,
        min_workers: int = 1,
        max_workers: int = 4,
        target_backlog: int = 10,
        min_spares: int = 0,
        spares: SpareRegistry | None = None,
    ) -> None:
        check_sizes(min_workers, max_workers, target_backlog)
        if min_spares < 0 or (min_spares and spares is None):
            raise ConfigError("min_spares must be 0, or at least 1 with a spare registry (the pool's Redis)")
        self.min_spares = min_spares
        self.spares = spares
        self.settings = settings
        self.lock = lock
        self.client = client or ecs_client()
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.target_backlog = target_backlog
        # (when, pool, tasks per key) of the last list_running: scale() trusts it this long
        self._listed: tuple[float, str, Counter[str]] = (float("-inf"), "", Counter())

    # -- contract ---------------------------------------------------------------------------
    def start(self, group: WorkerGroup) -> None:
        with self.lock(group):
            live = self._group_tasks(group)
            if not live:
                live = self._adopt(group)
            self._run(group, self.min_workers - len(live), live)

    def stop(self, group: WorkerGroup) -> None:
        with self.lock(group):
            live = self._group_tasks(group)
            if live:
                logger.info("stopping worker group", extra={"group_id": group.group_id, "workers": len(live)})
            self._stop(group, live)

    def list_running(self, pool: str) -> set[str]:
        listed_at = time.monotonic()
        keys: Counter[str] = Counter()
        arns = self._call("list_tasks", paginate=True, cluster=self.settings.cluster,
                          family=self.settings.family_for(pool), desiredStatus="RUNNING")
        for task in self._describe(arns):
            if task.get("desiredStatus") != "RUNNING" or _tag(task, TAG_POOL) != pool:
                continue
            key = key_from_tags(task.get("tags", []))
            if key is None and _tag(task, TAG_SPARE) is not None:
                continue  # a spare no key adopted yet
            if key is None:
                logger.warning("ECS task without a readable key tag ignored",
                               extra={"task": task.get("taskArn")})
                continue
            keys[key] += 1
        self._listed = (listed_at, pool, keys)
        return set(keys)

    def worker_count(self, group: WorkerGroup) -> int:
        return len(self._group_tasks(group))

    def scale(self, group: WorkerGroup, backlog: int) -> int:
        """Run or stop tasks so the group has ``clamp(ceil(backlog / target), min, max)``.

        Scaling down stops the newest tasks (SIGTERM first, each finishes its request in hand).
        """
        wanted = desired_workers(backlog, min_workers=self.min_workers, max_workers=self.max_workers,
                                 target_backlog=self.target_backlog)
        listed_at, pool, tasks = self._listed
        fresh = pool == group.pool and time.monotonic() - listed_at < LISTING_TRUSTED_S
        if fresh and tasks[group.key] == wanted:
            return wanted  # the pass's own listing shows the size wanted: no ECS call
        with self.lock(group):
            live = self._group_tasks(group)
            if len(live) < wanted:
                self._run(group, wanted - len(live), live)
            elif len(live) > wanted:
                # Newest first by createdAt; ties (or no createdAt) keep the reverse listing order.
                order = sorted(enumerate(live), key=lambda it: (str(it[1].get("createdAt", "")), it[0]))
                surplus = [task for _, task in reversed(order)][:len(live) - wanted]
                logger.info("scaling worker group down", extra={"group_id": group.group_id,
                                                                "workers": wanted, "stopping": len(surplus)})
                self._stop(group, surplus)
        return wanted

    def keep_spares(self, pool: str) -> int:
        """Start spare tasks up to ``min_spares`` (capped by ``max_tasks``); how many it started.

        Counted: the pool's spare tasks no key adopted, registered or still starting; the registry's
        spares with no such task (stopped, Spot-interrupted) are forgotten.
        """
        if self.spares is None or pool != self.spares.pool:
            return 0
        started = self._spare_tasks(pool)
        waiting = [task for task in started if key_from_tags(task.get("tags", [])) is None]
        alive = {_tag(task, TAG_SPARE) for task in waiting}
        for worker_id in self.spares.waiting() - alive:
            logger.warning("spare without a task forgotten", extra={"pool": pool, "worker_id": worker_id})
            self.spares.forget(worker_id)
        wanted = self.min_spares - len(waiting)
        if wanted > 0 and self.settings.max_tasks:
            pool_tasks = self._call("list_tasks", paginate=True, cluster=self.settings.cluster,
                                    family=self.settings.family_for(pool), desiredStatus="RUNNING")
            room = self.settings.max_tasks - len(pool_tasks)
            if room < wanted:
                logger.warning("spares capped by the pool's task limit",
                               extra={"pool": pool, "max_tasks": self.settings.max_tasks,
                                      "spares": len(waiting), "starting": max(0, room)})
            wanted = min(wanted, room)
        # The token: the spare tasks seen (adopted ones too) and the minute, so a pass that saw what
        # the one before it saw (ListTasks lagging its RunTask) sends the same requests, and a later
        # pass, after a spare was adopted and replaced, never repeats an earlier pass's token.
        seen = sorted(str(t.get("taskArn")) for t in started)
        minute = str(int(time.time() // 60))
        failures: list[str] = []
        for index in range(max(0, wanted)):
            token = hashlib.sha256("|".join([pool, "spare", minute, str(index), *seen]).encode()).hexdigest()
            worker_id = f"{pool}-spare-{token[:8]}"
            environment = {"WORKER_ID": worker_id, "WORKER_POOL": pool, SPARE_ENV: "1",
                           "WORKER_ACTIVITY_EXCHANGE": protocol.activity_exchange(pool)}
            tags = [{"key": TAG_POOL, "value": pool}, {"key": TAG_SPARE, "value": worker_id}]
            failures += self._run_task(pool, _spares_started_by(pool), environment, tags, token, worker_id)
        _raise_failures(failures, _spares_started_by(pool))
        return max(0, wanted)

    # -- spares ---------------------------------------------------------------------------------
    def _spare_tasks(self, pool: str) -> list[dict[str, Any]]:
        """The pool's tasks started as spares that ECS wants running (adopted ones included)."""
        arns = self._call("list_tasks", paginate=True, cluster=self.settings.cluster,
                          startedBy=_spares_started_by(pool))
        return [task for task in self._describe(arns) if task.get("desiredStatus") == "RUNNING"]

    def _adopt(self, group: WorkerGroup) -> list[dict[str, Any]]:
        """Hand the group's key to a ready spare task and tag it the group's: ``[task]``, or ``[]``."""
        if self.spares is None or group.pool != self.spares.pool:
            return []
        for task in self._spare_tasks(group.pool):
            worker_id = _tag(task, TAG_SPARE)
            if worker_id is None or key_from_tags(task.get("tags", [])) is not None:
                continue
            try:
                claimed = self.spares.claim(worker_id, group.key)
            except Exception:  # Redis failing: start as without spares
                logger.warning("claiming a spare failed; starting a task", extra={"group_id": group.group_id})
                return []
            if not claimed:
                continue  # not registered yet, or another control plane's key
            try:
                self._call("tag_resource", resourceArn=task["taskArn"], tags=self._group_tags(group))
            except DriverError:
                logger.exception("tagging an adopted spare failed; stopping it, starting a task",
                                 extra={"group_id": group.group_id, "worker_id": worker_id})
                self._stop(group, [task])
                return []
            logger.info("spare adopted a group", extra={"group_id": group.group_id, "worker_id": worker_id,
                                                        "task": task.get("taskArn")})
            return [task]
        return []

    # -- ECS calls ----------------------------------------------------------------------------
    def _call(self, operation: str, *, paginate: bool = False, **kwargs: Any) -> Any:
        """One ECS call; botocore's failures (after its retries) become ``DriverError``."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if paginate:
                pages = self.client.get_paginator(operation).paginate(**kwargs)
                return [arn for page in pages for arn in page.get("taskArns", [])]
            return getattr(self.client, operation)(**kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise DriverError(f"ECS {operation} failed: {exc}") from exc

    def _describe(self, arns: Sequence[str]) -> list[dict[str, Any]]:
        tasks: list[dict[str, Any]] = []
        for i in range(0, len(arns), DESCRIBE_TASKS_MAX):
            response = self._call("describe_tasks", cluster=self.settings.cluster,
                                  tasks=list(arns[i:i + DESCRIBE_TASKS_MAX]), include=["TAGS"])
            tasks.extend(response.get("tasks", []))
        return tasks

    def _group_tasks(self, group: WorkerGroup) -> list[dict[str, Any]]:
        """The group's tasks that ECS wants running (starting ones included: they count)."""
        # ListTasks accepts startedBy only as its sole filter; desiredStatus defaults to RUNNING.
        arns = self._call("list_tasks", paginate=True, cluster=self.settings.cluster,
                          startedBy=group.group_id)
        tasks = [task for task in self._describe(arns) if task.get("desiredStatus") == "RUNNING"]
        if self.spares is not None:  # spares this group adopted were started by the pool's spares
            tasks += [task for task in self._spare_tasks(group.pool)
                      if _tag(task, TAG_GROUP) == group.group_id]
        return tasks

    def _group_tags(self, group: WorkerGroup) -> list[dict[str, str]]:
        return [{"key": TAG_POOL, "value": group.pool}, {"key": TAG_GROUP, "value": group.group_id},
                *key_tags(group.key)]

    def _run(self, group: WorkerGroup, count: int, live: Sequence[dict[str, Any]]) -> None:
        """Start ``count`` tasks, one ``RunTask`` each (every worker gets its own ``WORKER_ID``).

        The client token (and the worker id) derive from the group, the tasks seen and the index:
        two callers that saw the same tasks send identical requests, and ECS starts one task.
        """
        tags = self._group_tags(group)
        seen = sorted(str(t.get("taskArn")) for t in live)
        failures: list[str] = []
        for index in range(max(0, count)):
            token = hashlib.sha256("|".join([group.group_id, str(index), *seen]).encode()).hexdigest()
            worker_id = f"{group.group_id}-{token[:8]}"
            failures += self._run_task(group.pool, group.group_id, group.environment(worker_id), tags,
                                       token, worker_id)
        _raise_failures(failures, group.group_id)

    def _run_task(self, pool: str, started_by: str, environment: Mapping[str, str],
                  tags: list[dict[str, str]], token: str, worker_id: str) -> list[str]:
        """One task of the pool's definition on its capacity provider; ECS's failures to start it."""
        response = self._call(
            "run_task",
            cluster=self.settings.cluster,
            taskDefinition=self.settings.task_definition_for(pool),
            count=1,
            startedBy=started_by,
            group=f"switchyard:{pool}",
            capacityProviderStrategy=[{"capacityProvider": self.settings.capacity_provider, "weight": 1}],
            networkConfiguration={"awsvpcConfiguration": {
                "subnets": list(self.settings.subnets),
                "securityGroups": list(self.settings.security_groups),
                "assignPublicIp": "DISABLED",
            }},
            overrides={"containerOverrides": [{
                "name": self.settings.container,
                "environment": [{"name": k, "value": v} for k, v in environment.items()],
            }]},
            tags=tags,
            clientToken=token[:64],
        )
        if response.get("tasks"):
            logger.info("worker task started", extra={"group_id": started_by, "worker_id": worker_id,
                                                      "task": response["tasks"][0].get("taskArn")})
        return [f"{f.get('reason')} {f.get('detail', '')}".strip() for f in response.get("failures", [])]

    def _stop(self, group: WorkerGroup, tasks: Sequence[dict[str, Any]]) -> None:
        errors = []
        for task in tasks:
            try:
                self._call("stop_task", cluster=self.settings.cluster, task=task["taskArn"],
                           reason=f"switchyard: worker group {group.group_id} stopped or scaled down")
            except DriverError as exc:  # stop the others, then report
                errors.append(str(exc))
        if errors:
            raise DriverError(f"stopping {len(errors)} task(s) of {group.group_id} failed: {errors[0]}")


def _raise_failures(failures: Sequence[str], started_by: str) -> None:
    if failures:
        raise DriverError(f"ECS could not start {len(failures)} task(s) of {started_by}: "
                          f"{sorted(set(failures))}")


def _spares_started_by(pool: str) -> str:
    """Spare tasks' ``startedBy`` (a group id is ``{pool}-`` and 24 hex digits: never this)."""
    return f"{pool}-spares"


def _tag(task: dict[str, Any], name: str) -> str | None:
    return next((t.get("value") for t in task.get("tags", []) if t.get("key") == name), None)
