-- The transactional outbox read by `idemproc outbox` (PostgreSQL 13+).
--
-- A service inserts one row per event in the same transaction as its own
-- writes; the relay publishes committed rows to Kafka and then sets
-- published_at (outbox.after=mark) or deletes them (outbox.after=delete).
-- Rows of a rolled-back transaction never become visible, so they are never
-- published. Rename the table with outbox.table; the NOTIFY channel is the
-- table's name (without the schema).
--
--   psql "$DSN" -v ON_ERROR_STOP=1 -f config/sql/outbox.sql

CREATE TABLE IF NOT EXISTS idemproc_outbox (
    id              bigserial   PRIMARY KEY,  -- publish order (per key)
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    topic           text,                     -- NULL: outbox.topic
    key             text,                     -- Kafka key (business key)
    value           jsonb,                    -- the record value (bytea works too)
    headers         jsonb,                    -- {"name": "value", ...}
    message_id      uuid        NOT NULL DEFAULT gen_random_uuid(),
    idempotency_key text,                     -- header idempotency_key
    published_at    timestamptz,              -- set by the relay
    error           text                      -- why the broker can never take it
);

-- A queue-like table: every published row leaves a dead index entry the
-- claim has to step over until vacuum removes it. Vacuum after a fixed
-- number of changed rows rather than a fraction of a growing table.
ALTER TABLE idemproc_outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);

-- What the relay scans: unpublished rows in id order.
CREATE INDEX IF NOT EXISTS idemproc_outbox_pending
    ON idemproc_outbox (id) WHERE published_at IS NULL AND error IS NULL;

-- Wakes the relay (LISTEN idemproc_outbox) at the commit of every inserting
-- transaction; one notification per statement, PostgreSQL folds identical
-- ones of a transaction into one.
CREATE OR REPLACE FUNCTION idemproc_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_NAME, '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS idemproc_outbox_notify ON idemproc_outbox;
CREATE TRIGGER idemproc_outbox_notify
    AFTER INSERT ON idemproc_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION idemproc_outbox_notify();
