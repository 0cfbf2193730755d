-- The partitioned inbox: one row per (consumer, key, event_time) claim,
-- partitioned by day of event_time. PostgreSQL enforces a unique key on a
-- partitioned table only if it contains the partition column, so event_time
-- is in the primary key; it is the message's own time (producer's clock or
-- UUIDv7), never the time of processing, so every delivery of a message
-- lands in the same partition and meets its marker there. Partitions are
-- created ahead by EnsurePartitions and dropped by DropPartitions.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer     text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    message_id   text        NOT NULL,
    body_sha256  bytea       NOT NULL,
    event_time   timestamptz NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key, event_time)
) PARTITION BY RANGE (event_time);
