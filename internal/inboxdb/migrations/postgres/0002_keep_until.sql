-- keep_until: the time a marker's retention is counted from, the latest of
-- its write time and the event times of the messages that met it (a later
-- duplicate extends it). The prune deletes by it, on its index. Existing
-- markers start from the later of their write and event times, what the
-- prune used before. The default serves a claim by an older build during a
-- rolling deploy.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS keep_until timestamptz;
UPDATE {{.Table}} SET keep_until = greatest(processed_at, event_time) WHERE keep_until IS NULL;
ALTER TABLE {{.Table}} ALTER COLUMN keep_until SET DEFAULT now(), ALTER COLUMN keep_until SET NOT NULL;
-- The prune and the stats go by keep_until now: the processed_at index
-- only cost every claim a third index insertion, so it goes. Index names
-- always fit in 63 bytes (a table name of more than 46 bytes once got no
-- index from pgxinbox: PostgreSQL cut the name to the table's own).
CREATE INDEX IF NOT EXISTS {{index "keep_until"}} ON {{.Table}} (keep_until);
DROP INDEX IF EXISTS {{qindex "processed_at"}};
