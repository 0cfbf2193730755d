-- The inbox: one row per (consumer, key) claim. The primary key is the
-- constraint that decides every race between two deliveries.
-- Keys compare as bytes (COLLATE "C"): they are identifiers, not words, and
-- byte comparison is both locale-proof and faster in the primary key.
-- IF NOT EXISTS: pgxinbox and sqlinbox create the same table, and a user may
-- switch stores.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer     text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    message_id   text        NOT NULL,
    body_sha256  bytea       NOT NULL,
    event_time   timestamptz,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key)
);
CREATE INDEX IF NOT EXISTS {{index "processed_at"}} ON {{.Table}} (processed_at);
