"""What ``cdk destroy`` must do before CloudFormation can delete the workers' cluster: stop the
worker tasks the control plane started.

Tasks started by ``RunTask`` are not CloudFormation's, so nothing in the stack stops them; ECS refuses
to delete a cluster (and its capacity provider associations) that still has running tasks, and their
network interfaces hold the security group and the subnets. The pools custom resource's Delete calls
``stop_worker_tasks``; the reconcile schedules and the orphan mappings depend on that resource, so
CloudFormation has deleted them (nothing starts a group any more) when it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from switchyard.core.errors import ConfigError
from switchyard.core.observability import logger

DESCRIBE_MAX = 100  # DescribeTasks takes at most 100 tasks


def _running(client: Any, cluster: str, families: Sequence[str]) -> list[str]:
    pages = client.get_paginator("list_tasks")
    return [arn for family in families
            for page in pages.paginate(cluster=cluster, family=family, desiredStatus="RUNNING")
            for arn in page.get("taskArns", [])]


def _not_stopped(client: Any, cluster: str, arns: Sequence[str]) -> list[str]:
    left = []
    for i in range(0, len(arns), DESCRIBE_MAX):
        tasks = client.describe_tasks(cluster=cluster, tasks=list(arns[i:i + DESCRIBE_MAX]))["tasks"]
        left += [t["taskArn"] for t in tasks if t.get("lastStatus") != "STOPPED"]
    return left


def stop_worker_tasks(client: Any, cluster: str, families: Sequence[str], *, timeout_s: float,
                      poll_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> list[str]:
    """Stop every running task of ``families`` in ``cluster`` and wait until ECS reports each one
    STOPPED (its network interface released); returns the tasks stopped. A task that appears
    meanwhile (an invocation already under way) is stopped too. Raises ``ConfigError`` naming the
    tasks left after ``timeout_s``: CloudFormation then reports the Delete as failed and a retry of
    ``cdk destroy`` runs it again."""
    deadline, stopped = clock() + timeout_s, list[str]()
    while True:
        fresh = [arn for arn in _running(client, cluster, families) if arn not in stopped]
        for arn in fresh:
            client.stop_task(cluster=cluster, task=arn, reason="cdk destroy: the stack is being deleted")
        stopped += fresh
        left = _not_stopped(client, cluster, stopped)
        if not left and not fresh:
            logger.info("worker tasks stopped", extra={"cluster": cluster, "tasks": len(stopped)})
            return stopped
        if clock() > deadline:
            raise ConfigError(f"{len(left)} worker tasks of cluster {cluster} did not stop within "
                              f"{timeout_s:.0f} s ({', '.join(left[:3])}...): run cdk destroy again")
        if left:
            time.sleep(poll_s)
