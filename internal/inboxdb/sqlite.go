package inboxdb

import (
	"fmt"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// SQLiteTimeFormat is how SQLite stores times: fixed-width UTC with
// microseconds, so that stored times sort and compare correctly as text.
const SQLiteTimeFormat = "2006-01-02T15:04:05.000000Z"

// sqliteNow is SQLite's clock in SQLiteTimeFormat: its clock has
// milliseconds, three zeros give the fixed width.
const sqliteNow = `strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')`

// SQLite is the SQLite SQL of table (plain layout only): every statement
// idem sends to SQLite about an inbox is here. The list statements bind a
// plain "?" per parameter: with numbered ones (?NNN) the driver looks up
// each parameter's name in a list, which made a claim of 8,000 rows take
// seconds instead of milliseconds. The others number theirs.
func SQLite(t Table) *Dialect {
	q := t.Quoted()
	settings, horizons, book := t.Sibling(settingsTable), t.Sibling(horizonsTable), t.Sibling(migrationsTable)
	pauses, pauseLog := t.Sibling(pausesTable), t.Sibling(pauseLogTable)
	pruned := t.Sibling(prunedTable)
	positions := t.Sibling(positionsTable)
	d := &Dialect{
		Name:       "sqlite",
		Table:      t,
		Layout:     idemstore.LayoutPlain,
		TimeArg:    func(t time.Time) any { return t.UTC().Format(SQLiteTimeFormat) },
		ScanTime:   scanSQLiteTime,
		migrations: "migrations/sqlite",
	}
	// Per claim: consumer, key, message ID, body hash, event time, and the
	// event time again for keep_until (see sqliteKeepUntil).
	d.Claim = List{
		Head:      `INSERT INTO ` + q + ` (consumer, key, message_id, body_sha256, event_time, keep_until) VALUES `,
		Row:       `(?, ?, ?, ?, ?, ` + sqliteKeepUntil("?") + `)`,
		RowParams: 6,
		Tail:      ` ON CONFLICT (consumer, key) DO NOTHING RETURNING key`,
	}
	// The consumer, then one key per row.
	d.Lookup = List{
		Head:      `SELECT key, message_id, body_sha256, processed_at, keep_until FROM ` + q + ` WHERE consumer = ? AND key IN (`,
		Row:       `?`,
		RowParams: 1,
		Tail:      `)`,
	}
	// One (key, keep-until) per row, each key once, then the consumer.
	// Writes only where keep_until grows; at most MaxAhead past now.
	d.Extend = List{
		Head:      `UPDATE ` + q + ` SET keep_until = e.column2 FROM (VALUES `,
		Row:       `(?, min(?, ` + sqliteAhead + `))`,
		RowParams: 2,
		Tail:      `) AS e WHERE ` + q + `.consumer = ? AND ` + q + `.key = e.column1 AND ` + q + `.keep_until < e.column2`,
	}

	d.Now = `SELECT ` + sqliteNow
	// The inbox is a WITHOUT ROWID table: rows are found by primary key, on
	// the keep_until index in its order.
	d.PruneBatch = `DELETE FROM ` + q + `
WHERE (consumer, key) IN (
    SELECT consumer, key FROM ` + q + `
    WHERE keep_until < ?1
    ORDER BY keep_until
    LIMIT ?2)
RETURNING consumer, key`
	d.Prunable = `SELECT count(*) FROM ` + q + ` WHERE keep_until < ?1`
	d.Stats = `SELECT count(*),
       coalesce(sum(event_time IS NULL), 0),
       min(keep_until),
       coalesce(sum(keep_until < ?1), 0)
FROM ` + q

	d.Bookkeeping = []string{
		`CREATE TABLE IF NOT EXISTS ` + book + ` (
    table_name text PRIMARY KEY,
    version    integer NOT NULL,
    applied_at TEXT NOT NULL DEFAULT (` + sqliteNow + `)
)`,
		`CREATE TABLE IF NOT EXISTS ` + settings + ` (
    table_name TEXT PRIMARY KEY,
    layout     TEXT    NOT NULL,
    window_ms  INTEGER NOT NULL CHECK (window_ms > 0),
    -- After a lengthening: the window before it, and when it happened.
    previous_window_ms INTEGER,
    changed_at         TEXT
)`,
		`CREATE TABLE IF NOT EXISTS ` + horizons + ` (
    table_name TEXT    NOT NULL,
    consumer   TEXT    NOT NULL,
    horizon_ms INTEGER NOT NULL,
    seen_at    TEXT    NOT NULL DEFAULT (` + sqliteNow + `),
    PRIMARY KEY (table_name, consumer)
)`,
		`CREATE TABLE IF NOT EXISTS ` + pruned + ` (
    table_name TEXT    NOT NULL,
    consumer   TEXT    NOT NULL,
    pruned_at  TEXT    NOT NULL,
    source     TEXT    NOT NULL, -- what was pruned: '' for a delete, a partition's name
    keys       INTEGER NOT NULL,
    filter     BLOB    NOT NULL,
    PRIMARY KEY (table_name, consumer, pruned_at, source)
)`,
		`CREATE TABLE IF NOT EXISTS ` + pauses + ` (
    table_name TEXT NOT NULL,
    consumer   TEXT NOT NULL,
    paused_at  TEXT NOT NULL DEFAULT (` + sqliteNow + `),
    paused_by  TEXT NOT NULL,
    reason     TEXT NOT NULL,
    PRIMARY KEY (table_name, consumer)
)`,
		`CREATE TABLE IF NOT EXISTS ` + pauseLog + ` (
    table_name TEXT NOT NULL,
    consumer   TEXT NOT NULL,
    at         TEXT NOT NULL DEFAULT (` + sqliteNow + `),
    action     TEXT NOT NULL,
    actor      TEXT NOT NULL,
    reason     TEXT NOT NULL
)`,
		`CREATE TABLE IF NOT EXISTS ` + positions + ` (
    table_name  TEXT    NOT NULL,
    consumer    TEXT    NOT NULL,
    source      TEXT    NOT NULL, -- a log broker's partition: topic/partition
    next_offset INTEGER NOT NULL, -- the position just past the last settled record
    updated_at  TEXT    NOT NULL DEFAULT (` + sqliteNow + `),
    PRIMARY KEY (table_name, consumer, source)
)`,
	}
	d.PausesExist = `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '` + pausesTable + `'`
	d.ReadPause = `SELECT paused_at, paused_by, reason FROM ` + pauses + ` WHERE table_name = ?1 AND consumer = ?2`
	d.ListPauses = `SELECT consumer, paused_at, paused_by, reason FROM ` + pauses + ` WHERE table_name = ?1 ORDER BY consumer`
	d.InsertPause = `INSERT INTO ` + pauses + ` (table_name, consumer, paused_by, reason) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING`
	d.DeletePause = `DELETE FROM ` + pauses + ` WHERE table_name = ?1 AND consumer = ?2`
	d.LogPause = `INSERT INTO ` + pauseLog + ` (table_name, consumer, action, actor, reason) VALUES (?1, ?2, ?3, ?4, ?5)`
	d.InsertSummary = `INSERT INTO ` + pruned + ` (table_name, consumer, pruned_at, source, keys, filter) VALUES (?1, ?2, ?3, ?4, ?5, ?6)`
	d.SummaryTimes = `SELECT pruned_at, source, keys FROM ` + pruned + ` WHERE table_name = ?1 AND consumer = ?2 ORDER BY pruned_at DESC`
	d.ReadSummary = `SELECT filter FROM ` + pruned + ` WHERE table_name = ?1 AND consumer = ?2 AND pruned_at = ?3 AND source = ?4`
	d.OpenSummary = `SELECT pruned_at, keys, filter FROM ` + pruned + ` WHERE table_name = ?1 AND consumer = ?2 AND source = '' AND pruned_at >= ?3 ORDER BY pruned_at DESC LIMIT 1`
	d.GrowSummary = `UPDATE ` + pruned + ` SET keys = ?4, filter = ?5 WHERE table_name = ?1 AND consumer = ?2 AND pruned_at = ?3 AND source = ''`
	d.RecentKeys = `SELECT coalesce(sum(keys), 0) FROM ` + pruned + ` WHERE table_name = ?1 AND consumer = ?2 AND pruned_at >= ?3`
	d.DeleteSummary = `DELETE FROM ` + pruned + ` WHERE table_name = ?1 AND pruned_at < ?2`
	d.ReadVersion = `SELECT version FROM ` + book + ` WHERE table_name = ?1`
	d.WriteVersion = `INSERT INTO ` + book + ` (table_name, version) VALUES (?1, ?2)
ON CONFLICT (table_name) DO UPDATE SET version = excluded.version, applied_at = excluded.applied_at`
	d.ReadSettings = `SELECT layout, window_ms, previous_window_ms, CAST((julianday('now') - julianday(changed_at)) * 86400000 AS INTEGER)
FROM ` + settings + ` WHERE table_name = ?1`
	d.InsertSettings = `INSERT INTO ` + settings + ` (table_name, layout, window_ms) VALUES (?1, ?2, ?3)`
	d.UpdateWindow = `UPDATE ` + settings + ` SET window_ms = ?2, previous_window_ms = ?3,
    changed_at = CASE WHEN ?3 IS NULL THEN NULL ELSE ` + sqliteNow + ` END
WHERE table_name = ?1`
	d.RecordHorizon = `INSERT INTO ` + horizons + ` (table_name, consumer, horizon_ms) VALUES (?1, ?2, ?3)
ON CONFLICT (table_name, consumer) DO UPDATE SET horizon_ms = excluded.horizon_ms, seen_at = excluded.seen_at`
	d.Horizons = `SELECT consumer, horizon_ms, seen_at FROM ` + horizons + ` WHERE table_name = ?1 ORDER BY horizon_ms DESC, consumer`
	d.RecordPosition = `INSERT INTO ` + positions + ` (table_name, consumer, source, next_offset) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (table_name, consumer, source) DO UPDATE SET next_offset = excluded.next_offset, updated_at = excluded.updated_at`
	d.Positions = `SELECT source, next_offset, updated_at FROM ` + positions + ` WHERE table_name = ?1 AND consumer = ?2 ORDER BY source`
	d.ForgetPositions = `DELETE FROM ` + positions + ` WHERE table_name = ?1 AND consumer = ?2`
	return d
}

// sqliteKeepUntil is [pgKeepUntil] for SQLite: the later of now and the
// event time et, at most MaxAhead past now. max() of text is NULL when one
// argument is, hence the coalesce (the empty string sorts before every
// time).
func sqliteKeepUntil(et string) string {
	return `min(max(` + sqliteNow + `, coalesce(` + et + `, '')), ` + sqliteAhead + `)`
}

// sqliteAhead is now plus MaxAhead.
var sqliteAhead = `strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', '+` + fmt.Sprint(int(MaxAhead/time.Second)) + ` seconds')`

func scanSQLiteTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case nil:
		return time.Time{}, nil
	case string:
		return time.Parse(SQLiteTimeFormat, t)
	case []byte:
		return time.Parse(SQLiteTimeFormat, string(t))
	case time.Time:
		return t, nil
	}
	return time.Time{}, fmt.Errorf("scanning time: unexpected %T", v)
}
