"""Request queues a broker crash left without a leader: found, and declared again.

A quorum queue declared about a second or less before RabbitMQ is SIGKILLed can come back as a new,
empty Ra member that never elects itself: the node's Ra name registry had not reached the disk
(node log: "Quorum queue recovery: configured member of queue ... was not found on this node.
Starting member as a new one. Context: name_not_registered"; rabbitmq-server#15725, reproduced here
on 4.0.5 by declaring a queue and killing the node at once). Every operation on it then waits for
the broker's own 65 s timeout: a publish blocks the publisher's whole channel (a client's calls to
every key, the orphan handler's forwarding), a consume ends with ``INTERNAL_ERROR`` (the key's
workers exit 1, again and again), and nothing heals until the queue is deleted. Its messages sit in
the member that was lost: out of reach, so deleting it loses nothing more.

The reconciler watches the request queues' statistics, which a leader reports every few seconds. A
queue silent for ``silent_s`` is probed with a consume on a connection of its own; if the broker
does not answer within ``probe_timeout_s``, the queue is deleted (the broker force-deletes a queue
it cannot reach a quorum for) and declared again, bound if its group is active. The delete also
frees the publishes and consumes that were blocked on it: the publishers get a nack.

In a cluster, a queue also goes silent when the nodes of its leader and of enough of its members are
down (measured on 4.0.5: its state ``minority`` or ``down``, no statistics while its leader's node is
away). That queue is not lost: it comes back, messages and all, with its nodes. It is never deleted:
``members_away`` names the nodes it waits for, and the reconciler reports it instead. (Two of three
nodes down is not such a case: under ``pause_minority``, Amazon MQ's setting and
scripts/rabbitmq-cluster.sh's, the third pauses as well and nothing answers at all.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

SILENT_S = 10.0
# The management API's ``state`` of a quorum queue that has no leader to elect: statistics may still
# come (measured on 4.0.5, from a member left in a minority while its leader's node is up), so the
# state counts as silence too.
LEADERLESS_STATES = frozenset({"minority", "down"})
PROBE_TIMEOUT_S = 10.0
# Probes per pass: a broker that reports no queue statistics at all must not cost a connection per
# queue every pass; the longest silent go first, the others wait their turn.
MAX_PROBES = 4


@dataclass
class LeaderlessWatch:
    """When each request queue was first seen without statistics; kept across reconciler passes."""

    silent_s: float = SILENT_S
    probe_timeout_s: float = PROBE_TIMEOUT_S
    max_probes: int = MAX_PROBES
    clock: Callable[[], float] = time.monotonic
    _silent_since: dict[str, float] = field(default_factory=dict)

    def suspects(self, queues: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
        """Keys whose queue has reported no statistics, or a leaderless state, for ``silent_s`` (a new
        queue reports within seconds), at most ``max_probes``; a queue that reports is forgotten."""
        now = self.clock()
        silent = {key for key, queue in queues
                  if queue.get("messages") is None or queue.get("state") in LEADERLESS_STATES}
        self._silent_since = {key: self._silent_since.get(key, now) for key in silent}
        due = sorted((since, key) for key, since in self._silent_since.items()
                     if now - since >= self.silent_s)
        return [key for _, key in due[:self.max_probes]]

    def cleared(self, key: str) -> None:
        """The queue answered (or was declared again): start its silence over."""
        self._silent_since.pop(key, None)


def members_away(queue: dict[str, Any]) -> list[str]:
    """The nodes of ``queue``'s members (the management API's ``members``) whose member is not running
    (not ``online``: its node is down); none when the listing says nothing of either."""
    if queue.get("online") is None:
        return []
    return sorted(set(queue.get("members") or ()) - set(queue["online"]))
