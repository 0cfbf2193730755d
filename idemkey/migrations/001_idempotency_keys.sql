-- One row per (scope, key). The primary key decides every race between two
-- requests with the same key. A row whose status is NULL is a request in
-- progress, held by token until expires_at (its lease); a row with a status
-- is a stored response, replayed until expires_at (its TTL).
-- Keys compare as bytes (COLLATE "C"): they are identifiers, not words.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    scope       text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    fingerprint bytea       NOT NULL,
    token       text        NOT NULL,
    status      int,
    header      jsonb,
    body        bytea,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
-- Prune deletes by expires_at.
CREATE INDEX IF NOT EXISTS {{.ExpiresIndex}} ON {{.Table}} (expires_at);
