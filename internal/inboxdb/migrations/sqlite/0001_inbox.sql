-- The inbox: one marker per (consumer, key). Times are fixed-width UTC text
-- (2006-01-02T15:04:05.000000Z) so that they sort and compare as text; the
-- default pads SQLite's millisecond clock to the same width.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer     TEXT NOT NULL,
    key          TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    body_sha256  BLOB NOT NULL,
    event_time   TEXT,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')),
    PRIMARY KEY (consumer, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {{index "processed_at"}} ON {{.Table}} (processed_at);
