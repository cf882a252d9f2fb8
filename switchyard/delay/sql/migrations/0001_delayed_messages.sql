-- The one table of the seed, with bytes kept as bytes and times with their zone.
-- {schema} is substituted with a quoted identifier (psycopg.sql.Identifier), never with raw text.
CREATE TABLE IF NOT EXISTS {schema}.delayed_messages (
    id              varchar(128) PRIMARY KEY,          -- chronosMessageId: unique among waiting/ready rows
    seq             bigint GENERATED ALWAYS AS IDENTITY, -- this enqueuing of that id: deletes and resets
                                                         -- match it, so a re-enqueued id is never lost
    deadline        timestamptz  NOT NULL,
    readied_at      timestamptz,
    readied_by      uuid,
    message_headers jsonb        NOT NULL DEFAULT '[]',  -- [{{"name": "<base64 value>"}}, ...] in order
    message_key     bytea,
    message_value   bytea,
    enqueued_at     timestamptz  NOT NULL DEFAULT now(),
    CHECK ((readied_at IS NULL) = (readied_by IS NULL))
);

-- Phase 1 (ready): due rows not yet readied, in deadline order.
CREATE INDEX IF NOT EXISTS delayed_messages_waiting
    ON {schema}.delayed_messages (deadline) WHERE readied_at IS NULL;

-- Failure detection: readied rows, oldest readying first.
CREATE INDEX IF NOT EXISTS delayed_messages_ready
    ON {schema}.delayed_messages (readied_at) WHERE readied_at IS NOT NULL;
