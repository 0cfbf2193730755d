-- keep_until (see the PostgreSQL migration). SQLite adds a NOT NULL column
-- only with a constant default, and a constant would either prune a row an
-- older build writes at once ('') or never (a far future), so the table is
-- rebuilt with the clock as the default, the SQLite way. The prune and the
-- stats go by keep_until: the processed_at index is not rebuilt.
CREATE TABLE {{sibling "_keep_until_new"}} (
    consumer     TEXT NOT NULL,
    key          TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    body_sha256  BLOB NOT NULL,
    event_time   TEXT,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')),
    keep_until   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')),
    PRIMARY KEY (consumer, key)
) WITHOUT ROWID;
INSERT INTO {{sibling "_keep_until_new"}} (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until)
SELECT consumer, key, message_id, body_sha256, event_time, processed_at, max(processed_at, coalesce(event_time, ''))
FROM {{.Table}};
DROP TABLE {{.Table}};
ALTER TABLE {{sibling "_keep_until_new"}} RENAME TO {{.Name}};
CREATE INDEX IF NOT EXISTS {{index "keep_until"}} ON {{.Table}} (keep_until);
