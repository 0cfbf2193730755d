-- The inbox: one marker per (consumer, key). The primary key is what decides
-- races between concurrent claims; processed_at is indexed because retention
-- prunes by it. IF NOT EXISTS: pgxinbox creates the same table, and a user
-- may switch stores.
-- Keys compare as bytes (COLLATE "C"): they are identifiers, not words, and
-- byte comparison is both locale-proof and faster in the primary key.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer     text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    message_id   text        NOT NULL,
    body_sha256  bytea       NOT NULL,
    event_time   timestamptz,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key)
);
CREATE INDEX IF NOT EXISTS {{.Index}} ON {{.Table}} (processed_at);
