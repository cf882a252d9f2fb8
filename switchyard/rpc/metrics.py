"""The metric names the RPC part (dead letters, orphans, the reconciler) emits, defined once.

A stand-in holding only the names the alarms in stacks/ use: the part's own module replaces it."""

from __future__ import annotations

DEAD_LETTER_POISONED = "DeadLetterPoisoned"
DEAD_LETTER_EXPIRED = "DeadLetterExpired"
DEAD_LETTER_REJECTED = "DeadLetterRejected"
DEAD_LETTER_MAXLEN = "DeadLetterMaxlen"
DEAD_LETTER_DEAD_LETTERS = "DeadLetterDeadLetters"
DEAD_LETTER_RESPONSES = "DeadLetterResponses"
DEAD_LETTER_WITHOUT_REASON = "DeadLetterWithoutReason"
DEAD_LETTER_DELIVERY_LIMIT = "DeadLetterDeliveryLimit"
ORPHAN_FORWARDED = "OrphanForwarded"
ORPHAN_NEW_GROUPS = "OrphanNewGroups"
ORPHAN_GROUP_START_FAILURES = "OrphanGroupStartFailures"
RECONCILE_GROUPS_STARTED = "ReconcileGroupsStarted"
RECONCILE_GROUPS_STOPPED = "ReconcileGroupsStopped"
RECONCILE_DRIVER_ERRORS = "ReconcileDriverErrors"
RECONCILE_DEAD_LETTERING_STRANDED = "ReconcileDeadLetteringStranded"
QUEUE_DEPTH = "QueueDepth"

EMITTED: frozenset[str] = frozenset({
    DEAD_LETTER_POISONED,
    DEAD_LETTER_EXPIRED,
    DEAD_LETTER_REJECTED,
    DEAD_LETTER_MAXLEN,
    DEAD_LETTER_DEAD_LETTERS,
    DEAD_LETTER_RESPONSES,
    DEAD_LETTER_WITHOUT_REASON,
    DEAD_LETTER_DELIVERY_LIMIT,
    ORPHAN_FORWARDED,
    ORPHAN_NEW_GROUPS,
    ORPHAN_GROUP_START_FAILURES,
    RECONCILE_GROUPS_STARTED,
    RECONCILE_GROUPS_STOPPED,
    RECONCILE_DRIVER_ERRORS,
    RECONCILE_DEAD_LETTERING_STRANDED,
    QUEUE_DEPTH,
})
