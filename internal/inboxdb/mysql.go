package inboxdb

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// MySQLTimeFormat is how times are bound on MySQL: UTC DATETIME(6) text, so
// that the session's time_zone and the driver's loc play no part.
const MySQLTimeFormat = "2006-01-02 15:04:05.000000"

// mysqlNow is MySQL's clock in UTC, with microseconds.
const mysqlNow = `UTC_TIMESTAMP(6)`

// mysqlAhead is now plus MaxAhead.
var mysqlAhead = `(` + mysqlNow + ` + INTERVAL ` + fmt.Sprint(int(MaxAhead/time.Second)) + ` SECOND)`

// mysqlKeepUntil is [pgKeepUntil] for MySQL: the later of now and the event
// time et, at most MaxAhead past now (GREATEST is NULL when an argument is).
func mysqlKeepUntil(et string) string {
	return `LEAST(GREATEST(` + mysqlNow + `, COALESCE(` + et + `, '1000-01-01')), ` + mysqlAhead + `)`
}

// MySQL is the MySQL/MariaDB SQL of table (plain layout only). Identifiers
// are double-quoted: the session must run with sql_mode ANSI_QUOTES
// (mysqlinbox.Open sets it). Parameters are positional "?", so a statement
// whose natural order differs from its documented parameter order binds
// them first in a derived table of one row.
//
// The claim is two statements ([MySQLClaimed]): MySQL's INSERT has no
// RETURNING, and its affected-rows count is per statement, not per row.
// The INSERT writes the transaction's random claim token into every row it
// inserts and leaves an existing row as it is (ON DUPLICATE KEY UPDATE of
// the key to itself: unlike INSERT IGNORE it swallows no other error); the
// SELECT then reads which keys carry the token. Only this transaction can
// have written that token, and it always sees its own writes, so the answer
// is exact whatever the isolation level. A concurrent claimer of the same
// key waits on the row lock of the first inserter's uncommitted row and,
// once that commits, finds it a duplicate; if it rolls back, inserts it.
func MySQL(t Table) *Dialect {
	q := t.Quoted()
	settings, horizons, book := t.Sibling(settingsTable), t.Sibling(horizonsTable), t.Sibling(migrationsTable)
	pruned := t.Sibling(prunedTable)
	pauses, pauseLog := t.Sibling(pausesTable), t.Sibling(pauseLogTable)
	positions := t.Sibling(positionsTable)
	d := &Dialect{
		Name:       "mysql",
		Table:      t,
		Layout:     idemstore.LayoutPlain,
		TimeArg:    func(t time.Time) any { return t.UTC().Format(MySQLTimeFormat) },
		ScanTime:   scanMySQLTime,
		migrations: "migrations/mysql",
	}
	// Per claim: consumer, key, message ID, body hash, event time, the
	// event time again for keep_until, and the claim token.
	d.Claim = List{
		Head:      `INSERT INTO ` + q + ` (consumer, "key", message_id, body_sha256, event_time, keep_until, claim_token) VALUES `,
		Row:       `(?, ?, ?, ?, ?, ` + mysqlKeepUntil("?") + `, ?)`,
		RowParams: 7,
		Tail:      ` ON DUPLICATE KEY UPDATE "key" = "key"`,
	}
	d.Lookup = List{
		Head:      `SELECT "key", message_id, body_sha256, processed_at, keep_until FROM ` + q + ` WHERE consumer = ? AND "key" IN (`,
		Row:       `?`,
		RowParams: 1,
		Tail:      `)`,
	}
	// One (key, keep-until) per row, joined by UNION ALL ([MySQLExtend]),
	// then the consumer.
	d.Extend = List{
		Head:      `UPDATE ` + q + ` i JOIN (`,
		Row:       `SELECT CAST(? AS BINARY) AS k, CAST(? AS DATETIME(6)) AS t`,
		RowParams: 2,
		Tail: `) e ON i."key" = e.k SET i.keep_until = LEAST(e.t, ` + mysqlAhead + `)
WHERE i.consumer = ? AND i.keep_until < LEAST(e.t, ` + mysqlAhead + `)`,
	}

	d.Now = `SELECT ` + mysqlNow
	// DELETE ... RETURNING is MariaDB's (10.0 and later); MySQL has none,
	// and sqlinbox's MySQL driver runs this batch as a SELECT ... FOR
	// UPDATE of the keys and a DELETE of them in one transaction instead.
	d.PruneBatch = `DELETE FROM ` + q + ` WHERE keep_until < ? ORDER BY keep_until LIMIT ? RETURNING consumer, "key"`
	d.Prunable = `SELECT count(*) FROM ` + q + ` WHERE keep_until < ?`
	d.Stats = `SELECT count(*),
       COALESCE(SUM(event_time IS NULL), 0),
       MIN(keep_until),
       COALESCE(SUM(keep_until < ?), 0)
FROM ` + q
	// A named lock, held by the pruning session. Lock names are the
	// server's, not a database's: the name is a hash of the database and
	// the table, as it is limited to 64 characters.
	d.TryLock = `SELECT GET_LOCK(CONCAT('idem.prune.', SHA1(CONCAT(DATABASE(), '.', ?))), 0) = 1`
	d.Unlock = `SELECT RELEASE_LOCK(CONCAT('idem.prune.', SHA1(CONCAT(DATABASE(), '.', ?))))`

	text := `VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin`
	bin := `VARBINARY(1024)`
	d.Bookkeeping = []string{
		`CREATE TABLE IF NOT EXISTS ` + book + ` (
    table_name ` + text + ` NOT NULL PRIMARY KEY,
    version    INT NOT NULL,
    applied_at DATETIME(6) NOT NULL DEFAULT (` + mysqlNow + `)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + settings + ` (
    table_name ` + text + ` NOT NULL PRIMARY KEY,
    layout     ` + text + ` NOT NULL,
    window_ms  BIGINT NOT NULL CHECK (window_ms > 0),
    previous_window_ms BIGINT NULL,
    changed_at         DATETIME(6) NULL
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + horizons + ` (
    table_name ` + text + ` NOT NULL,
    consumer   ` + bin + ` NOT NULL,
    horizon_ms BIGINT NOT NULL,
    seen_at    DATETIME(6) NOT NULL DEFAULT (` + mysqlNow + `),
    PRIMARY KEY (table_name, consumer)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + pruned + ` (
    table_name ` + text + ` NOT NULL,
    consumer   ` + bin + ` NOT NULL,
    pruned_at  DATETIME(6) NOT NULL,
    source     ` + text + ` NOT NULL,
    "keys"     BIGINT NOT NULL,
    filter     LONGBLOB NOT NULL,
    PRIMARY KEY (table_name, consumer, pruned_at, source)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + pauses + ` (
    table_name ` + text + ` NOT NULL,
    consumer   ` + bin + ` NOT NULL,
    paused_at  DATETIME(6) NOT NULL DEFAULT (` + mysqlNow + `),
    paused_by  TEXT NOT NULL,
    reason     TEXT NOT NULL,
    PRIMARY KEY (table_name, consumer)
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + pauseLog + ` (
    table_name ` + text + ` NOT NULL,
    consumer   ` + bin + ` NOT NULL,
    at         DATETIME(6) NOT NULL DEFAULT (` + mysqlNow + `),
    action     ` + text + ` NOT NULL,
    actor      TEXT NOT NULL,
    reason     TEXT NOT NULL
) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + positions + ` (
    table_name  ` + text + ` NOT NULL,
    consumer    ` + bin + ` NOT NULL,
    source      ` + text + ` NOT NULL,
    next_offset BIGINT NOT NULL,
    updated_at  DATETIME(6) NOT NULL DEFAULT (` + mysqlNow + `),
    PRIMARY KEY (table_name, consumer, source)
) ENGINE=InnoDB`,
	}
	d.PausesExist = `SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '` + pausesTable + `'`
	d.ReadPause = `SELECT paused_at, paused_by, reason FROM ` + pauses + ` WHERE table_name = ? AND consumer = ?`
	d.ListPauses = `SELECT consumer, paused_at, paused_by, reason FROM ` + pauses + ` WHERE table_name = ? ORDER BY consumer`
	d.InsertPause = `INSERT INTO ` + pauses + ` (table_name, consumer, paused_by, reason) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE table_name = table_name`
	d.DeletePause = `DELETE FROM ` + pauses + ` WHERE table_name = ? AND consumer = ?`
	d.LogPause = `INSERT INTO ` + pauseLog + ` (table_name, consumer, action, actor, reason) VALUES (?, ?, ?, ?, ?)`
	d.InsertSummary = `INSERT INTO ` + pruned + ` (table_name, consumer, pruned_at, source, "keys", filter) VALUES (?, ?, ?, ?, ?, ?)`
	d.SummaryTimes = `SELECT pruned_at, source, "keys" FROM ` + pruned + ` WHERE table_name = ? AND consumer = ? ORDER BY pruned_at DESC`
	d.ReadSummary = `SELECT filter FROM ` + pruned + ` WHERE table_name = ? AND consumer = ? AND pruned_at = ? AND source = ?`
	d.OpenSummary = `SELECT pruned_at, "keys", filter FROM ` + pruned + ` WHERE table_name = ? AND consumer = ? AND source = '' AND pruned_at >= ? ORDER BY pruned_at DESC LIMIT 1`
	d.GrowSummary = `UPDATE ` + pruned + ` s JOIN (SELECT ? AS t, CAST(? AS BINARY) AS c, CAST(? AS DATETIME(6)) AS p, ? AS k, CAST(? AS BINARY) AS f) a
    ON s.table_name = a.t AND s.consumer = a.c AND s.pruned_at = a.p AND s.source = ''
SET s."keys" = a.k, s.filter = a.f`
	d.RecentKeys = `SELECT COALESCE(SUM("keys"), 0) FROM ` + pruned + ` WHERE table_name = ? AND consumer = ? AND pruned_at >= ?`
	// The settings row, locked for the transaction, serializes summary
	// writers of one table.
	d.SummaryLock = `SELECT table_name FROM ` + settings + ` WHERE table_name = ? FOR UPDATE`
	d.DeleteSummary = `DELETE FROM ` + pruned + ` WHERE table_name = ? AND pruned_at < ?`
	d.ReadVersion = `SELECT version FROM ` + book + ` WHERE table_name = ?`
	d.WriteVersion = `INSERT INTO ` + book + ` (table_name, version) VALUES (?, ?)
ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version)), applied_at = ` + mysqlNow
	d.ReadSettings = `SELECT layout, window_ms, previous_window_ms, TIMESTAMPDIFF(MICROSECOND, changed_at, ` + mysqlNow + `) DIV 1000
FROM ` + settings + ` WHERE table_name = ?`
	// Migrators are serialized on MySQL by a named lock (GET_LOCK) the
	// migrating session holds across DDL's implicit commits (sqlinbox's
	// MySQL driver); should one run without it, the first to record
	// settings still wins, and one racing it keeps the recorded ones.
	d.InsertSettings = `INSERT INTO ` + settings + ` (table_name, layout, window_ms) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE table_name = table_name`
	d.UpdateWindow = `UPDATE ` + settings + ` s JOIN (SELECT ? AS t, ? AS w, ? AS p) a ON s.table_name = a.t
SET s.window_ms = a.w, s.previous_window_ms = a.p,
    s.changed_at = CASE WHEN a.p IS NULL THEN NULL ELSE ` + mysqlNow + ` END`
	d.RecordHorizon = `INSERT INTO ` + horizons + ` (table_name, consumer, horizon_ms) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE horizon_ms = VALUES(horizon_ms), seen_at = ` + mysqlNow
	d.Horizons = `SELECT consumer, horizon_ms, seen_at FROM ` + horizons + ` WHERE table_name = ? ORDER BY horizon_ms DESC, consumer`
	d.RecordPosition = `INSERT INTO ` + positions + ` (table_name, consumer, source, next_offset) VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE next_offset = VALUES(next_offset), updated_at = ` + mysqlNow
	d.Positions = `SELECT source, next_offset, updated_at FROM ` + positions + ` WHERE table_name = ? AND consumer = ? ORDER BY source`
	d.ForgetPositions = `DELETE FROM ` + positions + ` WHERE table_name = ? AND consumer = ?`
	return d
}

// MySQLClaimed is the second statement of a MySQL claim: the consumer, the
// claim token, then one key per row → the keys of the batch this
// transaction inserted, with the token.
func MySQLClaimed(t Table) List {
	return List{
		Head:      `SELECT "key", claim_token FROM ` + t.Quoted() + ` WHERE consumer = ? AND claim_token = ? AND "key" IN (`,
		Row:       `?`,
		RowParams: 1,
		Tail:      `)`,
	}
}

// MySQLExtend glues d's Extend statement for n rows, whose derived table
// joins its rows by UNION ALL rather than commas.
func MySQLExtend(d *Dialect, n int) string {
	var b strings.Builder
	b.WriteString(d.Extend.Head)
	for i := range n {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString(d.Extend.Row)
	}
	b.WriteString(d.Extend.Tail)
	return b.String()
}

func scanMySQLTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case nil:
		return time.Time{}, nil
	case time.Time:
		return t.UTC(), nil
	case []byte:
		return parseMySQLTime(string(t))
	case string:
		return parseMySQLTime(t)
	}
	return time.Time{}, fmt.Errorf("scanning time: unexpected %T", v)
}

func parseMySQLTime(s string) (time.Time, error) {
	return time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.UTC)
}

// mysqlTableExists reports whether d's table exists in the connection's
// database.
func (d *Dialect) mysqlTableExists(ctx context.Context, c Conn) (bool, error) {
	var n int
	err := c.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`, d.Table.Name).Scan(&n)
	return n > 0, err
}

// mysqlReadCatalog reads the basics of d's table: whether it and the
// bookkeeping tables exist, and its columns with their types.
func (d *Dialect) mysqlReadCatalog(ctx context.Context, c Conn) (catalog, error) {
	cat := catalog{columns: map[string]string{}}
	err := c.QueryRow(ctx, `SELECT COALESCE(SUM(table_name = ?), 0), COALESCE(SUM(table_name = ?), 0)
FROM information_schema.tables WHERE table_schema = DATABASE()`, migrationsTable, settingsTable).Scan(&cat.versions, &cat.settings)
	if err != nil {
		return cat, err
	}
	err = c.Query(ctx, `SELECT column_name, column_type FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ?`,
		func(r Row) error {
			var name, typ string
			if err := r.Scan(&name, &typ); err != nil {
				return err
			}
			cat.columns[name] = strings.ToLower(typ)
			return nil
		}, d.Table.Name)
	if err != nil {
		return cat, err
	}
	if len(cat.columns) == 0 {
		return cat, nil
	}
	cat.exists, cat.relkind = true, "r"
	// Every InnoDB index is valid and none is partial; a prefix index
	// (sub_part) does not enforce uniqueness of the whole column, so it
	// counts as an expression.
	byName := map[string]*index{}
	var order []string
	err = c.Query(ctx, `SELECT index_name, non_unique, column_name, sub_part IS NOT NULL FROM information_schema.statistics
WHERE table_schema = DATABASE() AND table_name = ? ORDER BY index_name, seq_in_index`,
		func(r Row) error {
			var name string
			var nonUnique int
			var col sql.NullString
			var prefix bool
			if err := r.Scan(&name, &nonUnique, &col, &prefix); err != nil {
				return err
			}
			ix := byName[name]
			if ix == nil {
				ix = &index{name: name, unique: nonUnique == 0, valid: true}
				byName[name] = ix
				order = append(order, name)
			}
			c := col.String
			if prefix {
				c = ""
			}
			ix.columns = append(ix.columns, c)
			return nil
		}, d.Table.Name)
	if err != nil {
		return cat, err
	}
	for _, n := range order {
		cat.indexes = append(cat.indexes, *byName[n])
	}
	return cat, nil
}

// mysqlColumns is the inbox's columns and their types as
// information_schema.columns writes them.
var mysqlColumns = [][2]string{{"consumer", "varbinary(1024)"}, {"key", "varbinary(512)"}, {"message_id", "varbinary(1024)"},
	{"body_sha256", "varbinary(64)"}, {"event_time", "datetime(6)"}, {"processed_at", "datetime(6)"}, {"keep_until", "datetime(6)"},
	{"claim_token", "varbinary(16)"}}

// mysqlScriptTail is the end of MySQL's [Dialect.Script]: the schema
// version, which only grows, and the settings of a table that has none. The
// script runs with sql_mode ANSI_QUOTES, as the store does; MySQL DDL
// commits implicitly, and every statement of the script is idempotent.
func mysqlScriptTail(d *Dialect, key string, version int, window time.Duration) []Block {
	book, settings := d.Table.Sibling(migrationsTable), d.Table.Sibling(settingsTable)
	return []Block{
		{SQL: `INSERT INTO ` + book + ` (table_name, version) VALUES (` + key + `, ` + strconv.Itoa(version) + `)
ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version))`},
		{SQL: `INSERT INTO ` + settings + ` (table_name, layout, window_ms) VALUES (` + key + `, ` +
			sqlString(d.Layout.String()) + `, ` + strconv.FormatInt(window.Milliseconds(), 10) + `)
ON DUPLICATE KEY UPDATE table_name = table_name`},
	}
}
