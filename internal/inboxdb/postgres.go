package inboxdb

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// Postgres is the PostgreSQL SQL of table in layout: every statement idem
// sends to PostgreSQL about an inbox, from both stores, is here.
func Postgres(t Table, layout idemstore.Layout) *Dialect {
	q := t.Quoted()
	settings, horizons, book := t.Sibling(settingsTable), t.Sibling(horizonsTable), t.Sibling(migrationsTable)
	pruned := t.Sibling(prunedTable)
	pauses, pauseLog := t.Sibling(pausesTable), t.Sibling(pauseLogTable)
	positions := t.Sibling(positionsTable)
	d := &Dialect{
		Name:       "postgres",
		Table:      t,
		Layout:     layout,
		TimeArg:    func(t time.Time) any { return t },
		ScanTime:   scanPostgresTime,
		migrations: "migrations/postgres",
	}

	// The claim is the whole point of the library. Claims arrive sorted by
	// key; WITH ORDINALITY keeps that order, so concurrent batches take
	// their row locks in the same order and cannot deadlock. ON CONFLICT
	// names the primary key, so a user's other unique indexes on the inbox
	// are never silently absorbed. keep_until starts at the later of now and
	// the event time (see pgKeepUntil): the prune counts the window from it.
	// $1 consumer, $2 keys, $3 message IDs, $4 body hashes, $5 event times
	// (NULL when unknown), and on the partitioned layout $6 partition times.
	// A message ID given as '' is the key's: most consumers key by message
	// ID, and the claim then carries each ID once (a message ID is never
	// empty).
	conflict := "(consumer, key)"
	partCol, partVal, partArr, partAs := "", "", "", ""
	if layout == idemstore.LayoutPartitioned {
		d.migrations = "migrations/postgres-partitioned"
		// The partitioned table's unique key contains the partition column
		// (PostgreSQL enforces uniqueness per partition); the conflict
		// target must name exactly that key.
		conflict = "(consumer, key, partition_time)"
		partCol, partVal, partArr, partAs = ", partition_time", ", c.partition_time", ", $6::timestamptz[]", ", partition_time"
	}
	claim := func(with, from string) string {
		return with + `INSERT INTO ` + q + ` AS i (consumer, key, message_id, body_sha256, event_time, keep_until` + partCol + `)
SELECT $1, c.key, CASE c.message_id WHEN '' THEN c.key ELSE c.message_id END, c.body_sha256, c.event_time, ` + pgKeepUntil("c.event_time") + partVal + `
FROM ` + from + `unnest($2::text[], $3::text[], $4::bytea[], $5::timestamptz[]` + partArr + `) WITH ORDINALITY
     AS c(key, message_id, body_sha256, event_time` + partAs + `, n)
ORDER BY c.n
ON CONFLICT ` + conflict + ` DO NOTHING
RETURNING i.key`
	}
	d.Claim = List{SQL: claim("", "")}

	// One claim, as a statement that needs no arrays: a message processed
	// on its own sends this.
	partOne := ""
	if layout == idemstore.LayoutPartitioned {
		partOne = ", $6::timestamptz"
	}
	claimOne := func(with, from string) string {
		return with + `INSERT INTO ` + q + ` (consumer, key, message_id, body_sha256, event_time, keep_until` + partCol + `)
SELECT $1::text, $2::text, $3::text, $4::bytea, $5::timestamptz, ` + pgKeepUntil("$5::timestamptz") + partOne + from + `
ON CONFLICT ` + conflict + ` DO NOTHING`
	}
	d.ClaimOne = claimOne("", "")

	// The same claims under a lock timeout that the statement itself sets,
	// for the rest of the transaction, from its last parameter: one
	// statement instead of a set_config and the claim. The row to insert
	// is read from the CTE's, so the setting is made before any row is
	// inserted, and with it before any wait on a concurrent claim of the
	// same key (the server reads lock_timeout when it starts to wait).
	lockArg := 6
	if layout == idemstore.LayoutPartitioned {
		lockArg = 7
	}
	withLock := `WITH lt AS (SELECT set_config('lock_timeout', $` + fmt.Sprint(lockArg) + `::text, true))
`
	d.ClaimLocked = claim(withLock, "lt, ")
	d.ClaimOneLocked = claimOne(withLock, "\nFROM lt")

	// $1 consumer, $2 keys.
	d.Lookup = List{SQL: `SELECT key, message_id, body_sha256, processed_at, keep_until FROM ` + q + `
WHERE consumer = $1 AND key = ANY($2::text[])`}

	// Extend raises keep_until where the new time is later, and writes
	// nothing where it is not: a plain redelivery costs no write. $1
	// consumer, $2 keys (each once), $3 keep-until times.
	d.Extend = List{SQL: `UPDATE ` + q + ` AS i SET keep_until = e.keep_until
FROM (SELECT key, least(t, ` + pgAhead + `) FROM unnest($2::text[], $3::timestamptz[]) AS u(key, t)) AS e(key, keep_until)
WHERE i.consumer = $1 AND i.key = e.key AND i.keep_until < e.keep_until`}

	d.Now = `SELECT now()`
	// The ctids are collected first, on the keep_until index in its order
	// (without ORDER BY the planner may pick a sequential scan that re-reads
	// the dead rows of every earlier batch), and fetched with a TID scan,
	// the cheapest way to delete rows already found; the outer predicate
	// re-checks each row, so one extended in between is never deleted.
	d.PruneBatch = `DELETE FROM ` + q + `
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + q + `
    WHERE keep_until < $1
    ORDER BY keep_until
    LIMIT $2))
  AND keep_until < $1
RETURNING consumer, key`
	d.Prunable = `SELECT count(*) FROM ` + q + ` WHERE keep_until < $1`
	d.Stats = `SELECT count(*),
       count(*) FILTER (WHERE event_time IS NULL),
       min(keep_until),
       count(*) FILTER (WHERE keep_until < $1)
FROM ` + q
	if layout == idemstore.LayoutPartitioned {
		// Partitions go whole, by partition time: the cutoff given is the
		// start of the first day kept.
		d.Stats = `SELECT count(*),
       count(*) FILTER (WHERE event_time IS NULL),
       min(partition_time),
       count(*) FILTER (WHERE partition_time < $1)
FROM ` + q
	}
	// The prune election: a session-level advisory lock per table (its oid
	// makes it per schema too), answered false at once when held.
	d.TryLock = `SELECT pg_try_advisory_lock(hashtext('idem.prune'), hashtext($1::regclass::oid::text))`
	d.Unlock = `SELECT pg_advisory_unlock(hashtext('idem.prune'), hashtext($1::regclass::oid::text))`

	d.Bookkeeping = []string{
		// Held until the migration transaction ends: a second migrator
		// waits, then finds the version the first recorded. One key for
		// every table: the bookkeeping tables are shared, and CREATE TABLE
		// IF NOT EXISTS is not safe against a concurrent creator.
		`SELECT pg_advisory_xact_lock(hashtext('idem.migrate'))`,
		`CREATE TABLE IF NOT EXISTS ` + book + ` (
    table_name text PRIMARY KEY,
    version    int  NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`,
		`CREATE TABLE IF NOT EXISTS ` + settings + ` (
    table_name text PRIMARY KEY,
    layout     text   NOT NULL,
    window_ms  bigint NOT NULL CHECK (window_ms > 0),
    -- After a lengthening: the window before it, and when it happened.
    previous_window_ms bigint,
    changed_at         timestamptz
)`,
		`CREATE TABLE IF NOT EXISTS ` + horizons + ` (
    table_name text   NOT NULL,
    consumer   text   NOT NULL,
    horizon_ms bigint NOT NULL,
    seen_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, consumer)
)`,
		`CREATE TABLE IF NOT EXISTS ` + pruned + ` (
    table_name text        NOT NULL,
    consumer   text        NOT NULL,
    pruned_at  timestamptz NOT NULL,
    source     text        NOT NULL, -- what was pruned: '' for a delete, a partition's name
    keys       bigint      NOT NULL,
    filter     bytea       NOT NULL,
    PRIMARY KEY (table_name, consumer, pruned_at, source)
)`,
		`CREATE TABLE IF NOT EXISTS ` + pauses + ` (
    table_name text NOT NULL,
    consumer   text NOT NULL,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    paused_by  text NOT NULL,
    reason     text NOT NULL,
    PRIMARY KEY (table_name, consumer)
)`,
		`CREATE TABLE IF NOT EXISTS ` + pauseLog + ` (
    table_name text NOT NULL,
    consumer   text NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    action     text NOT NULL,
    actor      text NOT NULL,
    reason     text NOT NULL
)`,
		`CREATE TABLE IF NOT EXISTS ` + positions + ` (
    table_name text   NOT NULL,
    consumer   text   NOT NULL,
    source     text   NOT NULL, -- a log broker's partition: topic/partition
    next_offset bigint NOT NULL, -- the position just past the last settled record
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, consumer, source)
)`,
	}
	// A role that may not read the pauses (granted only the inbox and
	// its settings) is told apart without reading them: a failed read
	// would abort the caller's transaction.
	pausesLit := `'` + strings.ReplaceAll(pauses, "'", "''") + `'`
	d.PausesExist = `SELECT CASE WHEN to_regclass(` + pausesLit + `) IS NULL THEN 0
    WHEN has_table_privilege(to_regclass(` + pausesLit + `), 'SELECT') THEN 1 ELSE 2 END`
	d.ReadPause = `SELECT paused_at, paused_by, reason FROM ` + pauses + ` WHERE table_name = $1 AND consumer = $2`
	d.ListPauses = `SELECT consumer, paused_at, paused_by, reason FROM ` + pauses + ` WHERE table_name = $1 ORDER BY consumer`
	d.InsertPause = `INSERT INTO ` + pauses + ` (table_name, consumer, paused_by, reason) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`
	d.DeletePause = `DELETE FROM ` + pauses + ` WHERE table_name = $1 AND consumer = $2`
	d.LogPause = `INSERT INTO ` + pauseLog + ` (table_name, consumer, action, actor, reason) VALUES ($1, $2, $3, $4, $5)`
	d.InsertSummary = `INSERT INTO ` + pruned + ` (table_name, consumer, pruned_at, source, keys, filter) VALUES ($1, $2, $3, $4, $5, $6)`
	d.SummaryTimes = `SELECT pruned_at, source, keys FROM ` + pruned + ` WHERE table_name = $1 AND consumer = $2 ORDER BY pruned_at DESC`
	d.ReadSummary = `SELECT filter FROM ` + pruned + ` WHERE table_name = $1 AND consumer = $2 AND pruned_at = $3 AND source = $4`
	d.SummaryLock = `SELECT pg_advisory_xact_lock(hashtext('idem.summary'), hashtext($1::regclass::oid::text))`
	d.OpenSummary = `SELECT pruned_at, keys, filter FROM ` + pruned + ` WHERE table_name = $1 AND consumer = $2 AND source = '' AND pruned_at >= $3 ORDER BY pruned_at DESC LIMIT 1`
	d.GrowSummary = `UPDATE ` + pruned + ` SET keys = $4, filter = $5 WHERE table_name = $1 AND consumer = $2 AND pruned_at = $3 AND source = ''`
	d.RecentKeys = `SELECT coalesce(sum(keys), 0) FROM ` + pruned + ` WHERE table_name = $1 AND consumer = $2 AND pruned_at >= $3`
	d.DeleteSummary = `DELETE FROM ` + pruned + ` WHERE table_name = $1 AND pruned_at < $2`
	d.PartitionKeys = `SELECT consumer, key FROM %s`
	d.ReadVersion = `SELECT version FROM ` + book + ` WHERE table_name = $1`
	d.WriteVersion = `INSERT INTO ` + book + ` (table_name, version) VALUES ($1, $2)
ON CONFLICT (table_name) DO UPDATE SET version = EXCLUDED.version, applied_at = now()`
	d.Relkind = `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`
	d.ReadSettings = `SELECT layout, window_ms, previous_window_ms, (extract(epoch FROM now() - changed_at) * 1000)::bigint
FROM ` + settings + ` WHERE table_name = $1`
	d.InsertSettings = `INSERT INTO ` + settings + ` (table_name, layout, window_ms) VALUES ($1, $2, $3)`
	d.UpdateWindow = `UPDATE ` + settings + ` SET window_ms = $2, previous_window_ms = $3,
    changed_at = CASE WHEN $3::bigint IS NULL THEN NULL ELSE now() END
WHERE table_name = $1`
	d.RecordHorizon = `INSERT INTO ` + horizons + ` (table_name, consumer, horizon_ms) VALUES ($1, $2, $3)
ON CONFLICT (table_name, consumer) DO UPDATE SET horizon_ms = EXCLUDED.horizon_ms, seen_at = now()`
	d.Horizons = `SELECT consumer, horizon_ms, seen_at FROM ` + horizons + ` WHERE table_name = $1 ORDER BY horizon_ms DESC, consumer`
	d.RecordPosition = `INSERT INTO ` + positions + ` (table_name, consumer, source, next_offset) VALUES ($1, $2, $3, $4)
ON CONFLICT (table_name, consumer, source) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()`
	d.Positions = `SELECT source, next_offset, updated_at FROM ` + positions + ` WHERE table_name = $1 AND consumer = $2 ORDER BY source`
	d.ForgetPositions = `DELETE FROM ` + positions + ` WHERE table_name = $1 AND consumer = $2`
	return d
}

// MaxAhead bounds keep_until: at most this far past the database's now,
// whatever event time a claim or an extension carries. The processor
// already treats an event time further ahead as no time at all (a clock
// gone wrong); the bound keeps a caller that does not from writing markers
// no prune would ever reach.
const MaxAhead = time.Hour

// pgKeepUntil is the keep_until of a marker met by a message with event
// time et (NULL when unknown): the later of now and et, at most MaxAhead
// past now.
func pgKeepUntil(et string) string {
	return `least(greatest(now(), ` + et + `), ` + pgAhead + `)`
}

// pgAhead is now plus MaxAhead.
var pgAhead = `now() + interval '` + fmt.Sprint(int(MaxAhead/time.Second)) + ` seconds'`

func scanPostgresTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case time.Time:
		return t, nil
	case nil:
		return time.Time{}, nil
	}
	return time.Time{}, fmt.Errorf("scanning time: unexpected %T", v)
}
