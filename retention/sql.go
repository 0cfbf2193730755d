package retention

// The prune SQL of every dialect, in one place. A marker goes when both its
// event time (when it has one) and its write time are older than the cutoff:
// see the package documentation for why that keeps the horizon guard's
// promise. The predicate is written so that the processed_at index, which
// every inbox has, drives the scan: markers leave in write order.

// PostgresPruneBatch deletes at most $2 markers of table older than the
// cutoff $1, in one short statement (its own transaction in autocommit).
// The ctids are collected first and fetched with a TID scan, which is the
// cheapest way to delete rows already found; the outer predicate re-checks
// each row, so a row that changed in between is never deleted wrongly.
// Ordering by processed_at keeps every batch on the index: without it the
// planner may pick a sequential scan that re-reads the dead rows of all
// earlier batches.
func PostgresPruneBatch(table string) string {
	return `DELETE FROM ` + table + `
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + table + `
    WHERE processed_at < $1 AND (event_time IS NULL OR event_time < $1)
    ORDER BY processed_at
    LIMIT $2))
  AND processed_at < $1 AND (event_time IS NULL OR event_time < $1)`
}

// PostgresPrunable counts the markers of table a prune with cutoff $1 deletes.
func PostgresPrunable(table string) string {
	return `SELECT count(*) FROM ` + table + `
WHERE processed_at < $1 AND (event_time IS NULL OR event_time < $1)`
}

// PostgresTryLock takes the session-level advisory lock that elects one
// pruning instance per table ($1 is the table's name; its oid makes the lock
// per table and per schema). It answers false at once when another session
// holds it.
const PostgresTryLock = `SELECT pg_try_advisory_lock(hashtext('idem.prune'), hashtext($1::regclass::oid::text))`

// PostgresUnlock releases [PostgresTryLock].
const PostgresUnlock = `SELECT pg_advisory_unlock(hashtext('idem.prune'), hashtext($1::regclass::oid::text))`

// PostgresStats reads the figures of [Stats] in one scan; $1 is the cutoff.
func PostgresStats(table string) string {
	return `SELECT count(*),
       count(*) FILTER (WHERE event_time IS NULL),
       min(greatest(event_time, processed_at)),
       count(*) FILTER (WHERE processed_at < $1 AND (event_time IS NULL OR event_time < $1)),
       now()
FROM ` + table
}

// SQLitePruneBatch is [PostgresPruneBatch] for SQLite, whose inbox is a
// WITHOUT ROWID table: rows are found by primary key. Times are fixed-width
// UTC text, so text comparison is time comparison.
func SQLitePruneBatch(table string) string {
	return `DELETE FROM ` + table + `
WHERE (consumer, key) IN (
    SELECT consumer, key FROM ` + table + `
    WHERE processed_at < ?1 AND (event_time IS NULL OR event_time < ?1)
    ORDER BY processed_at
    LIMIT ?2)`
}

// SQLitePrunable counts the markers a prune with cutoff ?1 deletes.
func SQLitePrunable(table string) string {
	return `SELECT count(*) FROM ` + table + `
WHERE processed_at < ?1 AND (event_time IS NULL OR event_time < ?1)`
}

// SQLiteStats is [PostgresStats] for SQLite. SQLite's max() of several
// arguments is NULL when one is, hence the coalesce.
func SQLiteStats(table string) string {
	return `SELECT count(*),
       coalesce(sum(event_time IS NULL), 0),
       min(max(coalesce(event_time, processed_at), processed_at)),
       coalesce(sum(processed_at < ?1 AND (event_time IS NULL OR event_time < ?1)), 0)
FROM ` + table
}
