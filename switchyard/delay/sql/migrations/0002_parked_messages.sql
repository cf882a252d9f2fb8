-- Messages the output broker refused for good (too large for the topic, an invalid record): moved
-- here with the reason instead of being retried forever, for a person to look at (`switchyard delay
-- parked`). Keyed by (id, seq): the same id may be parked again after a new enqueuing.
CREATE TABLE IF NOT EXISTS {schema}.parked_messages (
    id              varchar(128) NOT NULL,
    seq             bigint       NOT NULL,
    deadline        timestamptz  NOT NULL,
    message_headers jsonb        NOT NULL DEFAULT '[]',
    message_key     bytea,
    message_value   bytea,
    enqueued_at     timestamptz  NOT NULL,
    parked_at       timestamptz  NOT NULL DEFAULT now(),
    reason          text         NOT NULL,
    PRIMARY KEY (id, seq)
);
