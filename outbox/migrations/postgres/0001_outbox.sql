-- The outbox: one row per enqueued message, written in the producer's
-- transaction. seq orders a key's rows in commit order (Enqueue locks the
-- key first); shard = hash(key) mod the stored shard count.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id            text        NOT NULL UNIQUE,
    destination   text        NOT NULL,
    routing_key   text        NOT NULL DEFAULT '',
    key           text        NOT NULL DEFAULT '',
    shard         integer     NOT NULL,
    headers       text,
    body          bytea       NOT NULL,
    event_time    timestamptz NOT NULL,
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    available_at  timestamptz,
    sent_at       timestamptz,
    parked_at     timestamptz,
    parked_reason text
);
-- What the relay reads: the unsent rows in seq order (of the shards it
-- holds, a share of all: it reads past the others' rows).
CREATE INDEX IF NOT EXISTS {{index "unsent"}} ON {{.Table}} (seq) WHERE sent_at IS NULL AND parked_at IS NULL;
-- Rows that hold back their key's later rows: waiting after a refusal, or parked.
CREATE INDEX IF NOT EXISTS {{index "held"}} ON {{.Table}} (shard, key, seq) WHERE sent_at IS NULL AND (available_at IS NOT NULL OR parked_at IS NOT NULL);
-- What prune deletes.
CREATE INDEX IF NOT EXISTS {{index "sent"}} ON {{.Table}} (sent_at) WHERE sent_at IS NOT NULL;
-- Shard leases: a relay publishes a shard's rows only while it holds its lease.
CREATE TABLE IF NOT EXISTS {{.Leases}} (
    shard      integer     PRIMARY KEY,
    owner      text        NOT NULL DEFAULT '',
    epoch      bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL
);
-- Running relays, so that leases are shared fairly among them.
CREATE TABLE IF NOT EXISTS {{.Relays}} (
    owner      text        PRIMARY KEY,
    seen_until timestamptz NOT NULL
);
