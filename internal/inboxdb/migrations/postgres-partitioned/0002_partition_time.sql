-- The partition column becomes partition_time, a function of the key alone
-- (the time inside a UUIDv7 message ID, or a period the business key names),
-- so that every copy of a message, whatever timestamp a republish gave it,
-- meets its marker: PRIMARY KEY (consumer, key, partition_time). PostgreSQL
-- renames a partition key column in place, in every partition, without
-- moving rows. Markers written before keep the event time they were
-- partitioned by; for UUIDv7 message IDs it is the same time.
-- event_time is again the message's event time, for stats and tracing;
-- keep_until as on the plain layout (informational here: whole days are
-- dropped by partition time).
ALTER TABLE {{.Table}} RENAME COLUMN event_time TO partition_time;
ALTER TABLE {{.Table}} ADD COLUMN event_time timestamptz, ADD COLUMN keep_until timestamptz;
UPDATE {{.Table}} SET event_time = partition_time, keep_until = greatest(processed_at, partition_time);
ALTER TABLE {{.Table}} ALTER COLUMN keep_until SET DEFAULT now(), ALTER COLUMN keep_until SET NOT NULL;
