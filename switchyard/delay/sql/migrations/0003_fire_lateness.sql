-- How late the fire loops published, per node and window of about ten seconds (nearest-rank
-- percentiles of the rows fired in it): what `switchyard status` and the console chart. Rows older
-- than an hour are removed by each insert (record_lateness), so the table stays a few hundred rows.
CREATE TABLE IF NOT EXISTS {schema}.fire_lateness (
    at      timestamptz NOT NULL DEFAULT now(),
    node    uuid        NOT NULL,
    fired   integer     NOT NULL,
    p50_ms  real        NOT NULL,
    p99_ms  real        NOT NULL,
    max_ms  real        NOT NULL,
    PRIMARY KEY (at, node)
);
