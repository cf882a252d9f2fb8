"""Every metric the rpc part emits, named once (the alarms and dashboards in ``stacks/`` use these).

The control plane's Lambda handlers report each outcome dataclass's count fields under a prefix
(``core.observability.emit_counts``: ``OrphanOutcome.new_groups`` -> ``OrphanNewGroups``); the
reconciler's handler adds the ``QueueDepth`` gauge per worker group. A test checks that what
``emit_counts`` derives from each outcome class is in ``EMITTED``, so renaming a field fails there.
"""

from __future__ import annotations

# The prefixes the handlers report their outcomes under (functions/rpc_*.py).
ORPHAN_PREFIX = "Orphan"
DEAD_LETTER_PREFIX = "DeadLetter"
ACTIVITY_PREFIX = "Activity"
RECONCILE_PREFIX = "Reconcile"
SCHEDULED_PREFIX = "Scheduled"  # the scheduled-call relay (functions/rpc_scheduled.py)

# A gauge per worker group (``WorkerGroup`` dimension: the group id), from the reconciler's pass.
QUEUE_DEPTH = "QueueDepth"
WORKER_GROUP_DIMENSION = "WorkerGroup"


# control.orphans.OrphanOutcome
ORPHAN_ORPHANS = "OrphanOrphans"
ORPHAN_FORWARDED = "OrphanForwarded"
ORPHAN_KEYS = "OrphanKeys"
ORPHAN_NEW_GROUPS = "OrphanNewGroups"
ORPHAN_WITHOUT_KEY = "OrphanWithoutKey"
ORPHAN_EXPIRED = "OrphanExpired"
ORPHAN_MALFORMED_FIELDS = "OrphanMalformedFields"
ORPHAN_GROUP_STARTS = "OrphanGroupStarts"
ORPHAN_GROUP_START_FAILURES = "OrphanGroupStartFailures"
ORPHAN_UNDECODABLE = "OrphanUndecodable"
ORPHAN_INVALID_KEY = "OrphanInvalidKey"

# control.dead_letters.DeadLetterOutcome
DEAD_LETTER_DEAD_LETTERS = "DeadLetterDeadLetters"
DEAD_LETTER_RESPONSES = "DeadLetterResponses"
DEAD_LETTER_POISONED = "DeadLetterPoisoned"
DEAD_LETTER_WITHOUT_REPLY_TO = "DeadLetterWithoutReplyTo"
DEAD_LETTER_WITHOUT_REASON = "DeadLetterWithoutReason"
DEAD_LETTER_MALFORMED_FIELDS = "DeadLetterMalformedFields"
DEAD_LETTER_EXPIRED = "DeadLetterExpired"
DEAD_LETTER_DELIVERY_LIMIT = "DeadLetterDeliveryLimit"
DEAD_LETTER_REJECTED = "DeadLetterRejected"
DEAD_LETTER_MAXLEN = "DeadLetterMaxlen"
DEAD_LETTER_UNDECODABLE = "DeadLetterUndecodable"

# control.activity.ActivityOutcome
ACTIVITY_EVENTS = "ActivityEvents"
ACTIVITY_KEYS = "ActivityKeys"
ACTIVITY_REACTIVATED = "ActivityReactivated"
ACTIVITY_LATE_FOR_STOPPED = "ActivityLateForStopped"
ACTIVITY_WITHOUT_KEY = "ActivityWithoutKey"
ACTIVITY_UNKNOWN_EVENTS = "ActivityUnknownEvents"
ACTIVITY_MALFORMED_FIELDS = "ActivityMalformedFields"
ACTIVITY_LATENCY_REPORTS = "ActivityLatencyReports"
ACTIVITY_MALFORMED_LATENCY = "ActivityMalformedLatency"
ACTIVITY_UNDECODABLE = "ActivityUndecodable"

# control.reconciler.ReconcileOutcome
RECONCILE_SKIPPED = "ReconcileSkipped"
RECONCILE_REBUILT_GROUPS = "ReconcileRebuiltGroups"
RECONCILE_UNBOUND = "ReconcileUnbound"
RECONCILE_STOPPED = "ReconcileStopped"
RECONCILE_QUEUES_DELETED = "ReconcileQueuesDeleted"
RECONCILE_KEPT_NONEMPTY = "ReconcileKeptNonempty"
RECONCILE_WAITING_FOR_CONSUMERS = "ReconcileWaitingForConsumers"
RECONCILE_GROUPS_STARTED = "ReconcileGroupsStarted"
RECONCILE_GROUPS_STOPPED = "ReconcileGroupsStopped"
RECONCILE_DRIVER_ERRORS = "ReconcileDriverErrors"
RECONCILE_QUEUE_ERRORS = "ReconcileQueueErrors"
RECONCILE_TOMBSTONES_PURGED = "ReconcileTombstonesPurged"
RECONCILE_FOREIGN_QUEUES = "ReconcileForeignQueues"
RECONCILE_DEAD_LETTERING_PROBES = "ReconcileDeadLetteringProbes"
RECONCILE_DEAD_LETTERING_STRANDED = "ReconcileDeadLetteringStranded"
RECONCILE_LEADERLESS_REDECLARED = "ReconcileLeaderlessRedeclared"
RECONCILE_LEADERLESS_WAITING = "ReconcileLeaderlessWaiting"
RECONCILE_DEPTHS_SKIPPED = "ReconcileDepthsSkipped"
RECONCILE_SPARES_STARTED = "ReconcileSparesStarted"  # warm spare tasks started (ECS driver)

# control.scheduled.ScheduledOutcome
SCHEDULED_RECORDS = "ScheduledRecords"
SCHEDULED_PUBLISHED = "ScheduledPublished"
SCHEDULED_WITHOUT_POOL = "ScheduledWithoutPool"
SCHEDULED_UNKNOWN_POOL = "ScheduledUnknownPool"
SCHEDULED_MALFORMED = "ScheduledMalformed"
SCHEDULED_EXPIRED = "ScheduledExpired"
SCHEDULED_UNROUTABLE = "ScheduledUnroutable"
SCHEDULED_PARKED = "ScheduledParked"
SCHEDULED_PUBLISH_FAILURES = "ScheduledPublishFailures"

EMITTED: frozenset[str] = frozenset({
    QUEUE_DEPTH,
    ORPHAN_ORPHANS,
    ORPHAN_FORWARDED,
    ORPHAN_KEYS,
    ORPHAN_NEW_GROUPS,
    ORPHAN_WITHOUT_KEY,
    ORPHAN_EXPIRED,
    ORPHAN_MALFORMED_FIELDS,
    ORPHAN_GROUP_STARTS,
    ORPHAN_GROUP_START_FAILURES,
    ORPHAN_UNDECODABLE,
    ORPHAN_INVALID_KEY,
    DEAD_LETTER_DEAD_LETTERS,
    DEAD_LETTER_RESPONSES,
    DEAD_LETTER_POISONED,
    DEAD_LETTER_WITHOUT_REPLY_TO,
    DEAD_LETTER_WITHOUT_REASON,
    DEAD_LETTER_MALFORMED_FIELDS,
    DEAD_LETTER_EXPIRED,
    DEAD_LETTER_DELIVERY_LIMIT,
    DEAD_LETTER_REJECTED,
    DEAD_LETTER_MAXLEN,
    DEAD_LETTER_UNDECODABLE,
    ACTIVITY_EVENTS,
    ACTIVITY_KEYS,
    ACTIVITY_REACTIVATED,
    ACTIVITY_LATE_FOR_STOPPED,
    ACTIVITY_WITHOUT_KEY,
    ACTIVITY_UNKNOWN_EVENTS,
    ACTIVITY_MALFORMED_FIELDS,
    ACTIVITY_LATENCY_REPORTS,
    ACTIVITY_MALFORMED_LATENCY,
    ACTIVITY_UNDECODABLE,
    RECONCILE_SKIPPED,
    RECONCILE_REBUILT_GROUPS,
    RECONCILE_UNBOUND,
    RECONCILE_STOPPED,
    RECONCILE_QUEUES_DELETED,
    RECONCILE_KEPT_NONEMPTY,
    RECONCILE_WAITING_FOR_CONSUMERS,
    RECONCILE_GROUPS_STARTED,
    RECONCILE_GROUPS_STOPPED,
    RECONCILE_DRIVER_ERRORS,
    RECONCILE_QUEUE_ERRORS,
    RECONCILE_TOMBSTONES_PURGED,
    RECONCILE_FOREIGN_QUEUES,
    RECONCILE_DEAD_LETTERING_PROBES,
    RECONCILE_DEAD_LETTERING_STRANDED,
    RECONCILE_LEADERLESS_REDECLARED,
    RECONCILE_LEADERLESS_WAITING,
    RECONCILE_DEPTHS_SKIPPED,
    RECONCILE_SPARES_STARTED,
    SCHEDULED_RECORDS,
    SCHEDULED_PUBLISHED,
    SCHEDULED_WITHOUT_POOL,
    SCHEDULED_UNKNOWN_POOL,
    SCHEDULED_MALFORMED,
    SCHEDULED_EXPIRED,
    SCHEDULED_UNROUTABLE,
    SCHEDULED_PARKED,
    SCHEDULED_PUBLISH_FAILURES,
})
