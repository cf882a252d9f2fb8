-- Named queries of the delay store. Each block starts with "-- name --" and a comment saying why.
-- {schema} is a psycopg.sql.Identifier; every value is a bound parameter.

-- create_schema --
-- The schema and the migration ledger, created before any migration runs.
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- lock_migrations --
-- One migrator at a time per schema, for the length of the transaction.
SELECT pg_advisory_xact_lock(hashtext('switchyard.delay.migrate.' || %(schema)s));

-- applied_migrations --
-- Versions already applied, so migrating is idempotent.
SELECT version FROM {schema}.schema_migrations ORDER BY version;

-- record_migration --
-- Mark a migration applied (in the same transaction as its DDL).
INSERT INTO {schema}.schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- existing_ids --
-- Which of these ids are already stored (a lapsed message is fired at once only if not).
SELECT id FROM {schema}.delayed_messages WHERE id = ANY(%(ids)s::text[]);

-- create_staging --
-- Per session, once: where a batch is COPYed before it is inserted (emptied at every commit).
CREATE TEMP TABLE IF NOT EXISTS delay_staging (
    id              text,
    deadline        timestamptz,
    message_key     bytea,
    message_value   bytea,
    message_headers text
) ON COMMIT DELETE ROWS;

-- copy_staging --
-- Binary COPY of one batch into the staging table (same transaction as insert_staged).
COPY pg_temp.delay_staging (id, deadline, message_key, message_value, message_headers)
FROM STDIN (FORMAT BINARY);

-- insert_staged --
-- Enqueue the staged batch; an id already waiting or ready is ignored (re-delivery is a no-op).
INSERT INTO {schema}.delayed_messages (id, deadline, message_key, message_value, message_headers)
SELECT id, deadline, message_key, message_value, message_headers::jsonb FROM pg_temp.delay_staging
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- notify_enqueued --
-- Wake the fire loops (they LISTEN on the channel) with the earliest deadline just staged, in epoch
-- seconds; delivered at commit, so a node never wakes for rows it cannot see yet.
SELECT pg_notify(%(channel)s, extract(epoch FROM min(deadline))::text)
FROM pg_temp.delay_staging HAVING count(*) > 0;

-- next_deadline --
-- The earliest waiting deadline: how long a node with nothing due may sleep before claiming again.
SELECT min(deadline) FROM {schema}.delayed_messages WHERE readied_at IS NULL;

-- count_overdue --
-- Waiting rows whose deadline passed before %(before)s and that no node has claimed: the backlog a
-- person should hear about. Counted through the partial index, and capped so a huge backlog costs
-- a bounded scan.
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.delayed_messages
    WHERE readied_at IS NULL AND deadline < %(before)s
    LIMIT 100000
) AS overdue;

-- ready_due --
-- Phase 1: claim a bounded batch of due rows for this node. SKIP LOCKED lets several nodes run at
-- once without blocking; the re-check of readied_at IS NULL under the row lock stops double claims.
WITH due AS (
    SELECT id FROM {schema}.delayed_messages
    WHERE readied_at IS NULL AND deadline <= now() + %(horizon)s
    ORDER BY deadline
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.delayed_messages AS m
SET readied_at = now(), readied_by = %(node)s
FROM due
WHERE m.id = due.id
RETURNING m.id, m.seq, m.deadline, m.readied_at, m.message_key, m.message_value, m.message_headers::text;

-- delete_fired --
-- Phase 2: forget rows whose publication the broker confirmed; matching seq never deletes a newer
-- enqueuing of the same id. Ids not returned were already gone (taken over by a peer).
-- The batch comes as one JSON array of [id, seq] pairs (encoded in C, unlike array parameters).
DELETE FROM {schema}.delayed_messages AS m
USING (SELECT e->>0 AS id, (e->>1)::bigint AS seq FROM jsonb_array_elements(%(pairs)s::jsonb) AS e) AS f
WHERE m.id = f.id AND m.seq = f.seq
RETURNING m.id;

-- release_unfired --
-- Hand back rows this node readied but could not publish, so any node can fire them without
-- waiting for the hold time. Compare-and-set: only if still readied by us, at the time we read.
UPDATE {schema}.delayed_messages AS m
SET readied_at = NULL, readied_by = NULL
FROM unnest(%(ids)s::text[], %(seqs)s::bigint[], %(readied_ats)s::timestamptz[]) AS r(id, seq, readied_at)
WHERE m.id = r.id AND m.seq = r.seq AND m.readied_at = r.readied_at AND m.readied_by = %(node)s
RETURNING m.id;

-- park_refused --
-- Move rows the broker refused for good to parked_messages, with the reason; only rows still
-- readied by this node at the time read (compare-and-set, as release_unfired). One statement, so a
-- crash leaves each row either waiting-readied (failure detection resets it) or parked.
WITH moved AS (
    DELETE FROM {schema}.delayed_messages AS m
    USING unnest(%(ids)s::text[], %(seqs)s::bigint[], %(readied_ats)s::timestamptz[], %(reasons)s::text[])
        AS r(id, seq, readied_at, reason)
    WHERE m.id = r.id AND m.seq = r.seq AND m.readied_at = r.readied_at AND m.readied_by = %(node)s
    RETURNING m.id, m.seq, m.deadline, m.message_headers, m.message_key, m.message_value, m.enqueued_at,
              r.reason
)
INSERT INTO {schema}.parked_messages
    (id, seq, deadline, message_headers, message_key, message_value, enqueued_at, reason)
SELECT * FROM moved
ON CONFLICT (id, seq) DO NOTHING
RETURNING id;

-- park_records --
-- Records set aside with the reason, never scheduled (a fired scheduled call for a pool that does not
-- exist, or one that cannot be read): kept for a person to look at and replay. Keyed by (id, seq),
-- seq the record's offset: a record delivered again is parked once.
INSERT INTO {schema}.parked_messages
    (id, seq, deadline, message_headers, message_key, message_value, enqueued_at, reason)
SELECT r.id, r.seq, now(), r.headers, r.key, r.value, now(), r.reason
FROM unnest(%(ids)s::text[], %(seqs)s::bigint[], %(headers)s::jsonb[], %(keys)s::bytea[],
            %(values)s::bytea[], %(reasons)s::text[]) AS r(id, seq, headers, key, value, reason)
ON CONFLICT (id, seq) DO NOTHING;

-- parked --
-- The parked messages, newest first, for `switchyard delay parked`: with their key, headers and the
-- first value_bytes of their value (a message parked for its size can be megabytes).
SELECT id, deadline, parked_at, reason, octet_length(message_value), message_key,
       substring(message_value FROM 1 FOR %(value_bytes)s), message_headers
FROM {schema}.parked_messages
ORDER BY parked_at DESC
LIMIT %(limit)s;

-- parked_count --
-- How many are parked (what a replay left).
SELECT count(*) FROM {schema}.parked_messages;

-- replay_parked --
-- `switchyard delay replay`: parked messages back to waiting, due now (their cause was fixed), the
-- oldest first, in one statement. One row per id at a time (of an id parked twice, the oldest goes
-- back; the other waits for a later replay); an id that is waiting again under a new message is
-- skipped by ON CONFLICT and stays parked: only the rows inserted leave parked_messages. Two replays
-- at once: the second waits on the id's insert, then skips it.
WITH chosen AS (
    SELECT DISTINCT ON (id) id, seq, parked_at, message_key, message_value, message_headers
    FROM {schema}.parked_messages
    WHERE %(all)s OR id = ANY(%(ids)s::text[])
    ORDER BY id, parked_at, seq
), oldest AS (
    SELECT * FROM chosen ORDER BY parked_at, id LIMIT %(limit)s
), inserted AS (
    INSERT INTO {schema}.delayed_messages (id, deadline, message_key, message_value, message_headers)
    SELECT id, now(), message_key, message_value, message_headers FROM oldest
    ON CONFLICT (id) DO NOTHING
    RETURNING id
)
DELETE FROM {schema}.parked_messages AS p
USING oldest AS o JOIN inserted AS i ON i.id = o.id
WHERE p.id = o.id AND p.seq = o.seq
RETURNING p.id;

-- notify_replayed --
-- Wake the fire loops for the replayed rows (due now), as notify_enqueued does for a batch.
SELECT pg_notify(%(channel)s, extract(epoch FROM now())::text);

-- find_stuck --
-- Failure detection, part 1: rows readied longer ago than the hold time.
SELECT id, readied_at, readied_by::text FROM {schema}.delayed_messages
WHERE readied_at < now() - %(hold)s
ORDER BY readied_at
LIMIT %(limit)s;

-- reset_stuck --
-- Failure detection, part 2: compare-and-set on the values read, so a row that its node fired
-- meanwhile, or that another node already reset, is left alone.
UPDATE {schema}.delayed_messages AS m
SET readied_at = NULL, readied_by = NULL
FROM unnest(%(ids)s::text[], %(readied_ats)s::timestamptz[], %(readied_bys)s::uuid[]) AS s(id, readied_at, readied_by)
WHERE m.id = s.id AND m.readied_at = s.readied_at AND m.readied_by = s.readied_by
RETURNING m.id, s.readied_by::text;

-- counts --
-- Waiting and ready rows, for status and tests.
SELECT count(*) FILTER (WHERE readied_at IS NULL) AS waiting,
       count(*) FILTER (WHERE readied_at IS NOT NULL) AS ready
FROM {schema}.delayed_messages;

-- record_lateness --
-- One fire loop's window of lateness; windows older than an hour go in the same statement.
WITH expired AS (
    DELETE FROM {schema}.fire_lateness WHERE at < now() - interval '1 hour'
)
INSERT INTO {schema}.fire_lateness (node, fired, p50_ms, p99_ms, max_ms)
VALUES (%(node)s, %(fired)s, %(p50_ms)s, %(p99_ms)s, %(max_ms)s)
ON CONFLICT (at, node) DO NOTHING;

-- lateness --
-- The windows recorded since %(since)s, oldest first (every node's), for the status view.
SELECT extract(epoch FROM at)::float8, fired, p50_ms, p99_ms, max_ms FROM {schema}.fire_lateness
WHERE at >= %(since)s
ORDER BY at;

-- status_figures --
-- The figures of `switchyard status` in one round trip: waiting and ready rows, the overdue backlog
-- (capped as count_overdue), parked messages and the earliest waiting deadline.
SELECT (SELECT count(*) FROM {schema}.delayed_messages WHERE readied_at IS NULL),
       (SELECT count(*) FROM {schema}.delayed_messages WHERE readied_at IS NOT NULL),
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.delayed_messages
                              WHERE readied_at IS NULL AND deadline < %(before)s LIMIT 100000) AS o),
       (SELECT count(*) FROM {schema}.parked_messages),
       (SELECT min(deadline) FROM {schema}.delayed_messages WHERE readied_at IS NULL);
