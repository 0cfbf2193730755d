-- The partitioned inbox as first released: partitioned by day of event_time,
-- which 0002 renames to partition_time. PostgreSQL enforces a unique key on
-- a partitioned table only if it contains the partition column, so it is in
-- the primary key. Partitions are created ahead by EnsurePartitions and
-- dropped by DropPartitions.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer     text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    message_id   text        NOT NULL,
    body_sha256  bytea       NOT NULL,
    event_time   timestamptz NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key, event_time)
) PARTITION BY RANGE (event_time);
