-- The inbox on MySQL/MariaDB (InnoDB), quoted with ANSI_QUOTES. Consumer,
-- key and message ID are VARBINARY: compared byte for byte, never by a
-- case- or accent-insensitive collation. Times are DATETIME(6) in UTC.
-- claim_token is the random token of the transaction that inserted the row:
-- a claim reads back the keys carrying its own token to learn which ones it
-- inserted, as MySQL's INSERT has no RETURNING. MySQL DDL commits
-- implicitly, so this migration is idempotent rather than transactional.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer     VARBINARY(1024) NOT NULL,
    "key"        VARBINARY(512)  NOT NULL,
    message_id   VARBINARY(1024) NOT NULL,
    body_sha256  VARBINARY(64)   NOT NULL,
    event_time   DATETIME(6)     NULL,
    processed_at DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    keep_until   DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    claim_token  VARBINARY(16)   NOT NULL DEFAULT '',
    PRIMARY KEY (consumer, "key"),
    KEY {{index "keep_until"}} (keep_until)
) ENGINE=InnoDB;
