"""The noop driver (the keyed RPC design): workers are started by hand, the control loop only watches.

With this driver the control loop cannot know which groups run: ``list_running`` returns only
the groups it was told about at construction, and ``start``/``stop`` do nothing, so the loop
never stops anything and never starts anything either.
"""

from __future__ import annotations

from collections.abc import Iterable

from switchyard.core.observability import logger
from switchyard.rpc.ports import WorkerGroup, WorkerGroupDriver


class NoopDriver(WorkerGroupDriver):
    """Does nothing; reports ``running`` (the groups someone started by hand) as running."""

    def __init__(self, running: Iterable[WorkerGroup] = ()) -> None:
        self._running = frozenset(running)

    def start(self, group: WorkerGroup) -> None:
        logger.debug("noop driver: start the worker group by hand", extra={"group_id": group.group_id,
                                                                            "pool": group.pool})

    def stop(self, group: WorkerGroup) -> None:
        logger.debug("noop driver: stop the worker group by hand", extra={"group_id": group.group_id,
                                                                           "pool": group.pool})

    def list_running(self, pool: str) -> set[str]:
        return {group.key for group in self._running if group.pool == pool}
