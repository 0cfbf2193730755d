-- The outbox: one row per enqueued message, written in the producer's
-- transaction. SQLite has one writer at a time, so seq order is commit
-- order. Times are fixed-width UTC text, which sorts as time.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT    NOT NULL UNIQUE,
    destination   TEXT    NOT NULL,
    routing_key   TEXT    NOT NULL DEFAULT '',
    key           TEXT    NOT NULL DEFAULT '',
    shard         INTEGER NOT NULL,
    headers       TEXT,
    body          BLOB    NOT NULL,
    event_time    TEXT    NOT NULL,
    enqueued_at   TEXT    NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    available_at  TEXT,
    sent_at       TEXT,
    parked_at     TEXT,
    parked_reason TEXT
);
CREATE INDEX IF NOT EXISTS {{index "unsent"}} ON {{.Table}} (seq) WHERE sent_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS {{index "held"}} ON {{.Table}} (shard, key, seq) WHERE sent_at IS NULL AND (available_at IS NOT NULL OR parked_at IS NOT NULL);
CREATE INDEX IF NOT EXISTS {{index "sent"}} ON {{.Table}} (sent_at) WHERE sent_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS {{.Leases}} (
    shard      INTEGER PRIMARY KEY,
    owner      TEXT    NOT NULL DEFAULT '',
    epoch      INTEGER NOT NULL DEFAULT 0,
    expires_at TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS {{.Relays}} (
    owner      TEXT PRIMARY KEY,
    seen_until TEXT NOT NULL
);
