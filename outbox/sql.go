package outbox

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/inboxdb"
)

// sqliteTimeFormat is how times are stored on SQLite: fixed-width UTC text,
// which compares as time.
const sqliteTimeFormat = inboxdb.SQLiteTimeFormat

// never is the expiry of a lease nobody holds: long past on every clock.
var never = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)

// statements is every SQL statement the outbox sends to one database, for
// one table: the PostgreSQL ones use arrays, the SQLite ones JSON arrays
// read with json_each. Parameters are numbered $N in both; the SQLite ones
// are rewritten to ?N.
type statements struct {
	name       string // "postgres" or "sqlite"
	migrations string // directory of the migration templates

	timeArg  func(time.Time) any
	scanTime func(any) (time.Time, error)
	list     func([]int64) any // binds a list of integers
	// missing reports an error that says the table is not there.
	missing func(error) bool

	meta        string // creates the table of the stored version and shard count
	readMeta    string // → version, shards
	insertMeta  string // $1 version, $2 shards
	updateMeta  string // $1 version
	insertLease string // $1 shard, $2 never

	lockKeys string // $1 the table, $2 keys (PostgreSQL)
	insert   string // one row: $1 id … $8 event time, $9 enqueued at
	notify   string // $1 channel (PostgreSQL)

	read        string // $1 shards, $2 limit (see readSQL)
	readStrict  string
	validLeases string // $1 owner → shard, epoch of the leases it holds now
	markSent    string // $1 seqs
	markRefused string // $1 seq, $2 error, $3 retry after ms, $4 max attempts → parked
	presence    string // $1 owner, $2 ms
	absent      string // $1 owner
	forget      string // $1 ms: relays gone that long
	liveRelays  string // $1 owner → the number of other live relays
	claim       string // $1 owner, $2 term ms, $3 limit → shard, epoch
	renew       string // $1 owner, $2 term ms → shard, epoch
	release     string // $1 owner, $2 shards, $3 never

	stats     string // → destination, unsent, oldest unsent, parked, sent
	prune     string // $1 cutoff, $2 limit
	prunable  string // $1 cutoff → count
	unpark    string // $1 destination ("" any), $2 key ("" any), $3 id ("" any) → rows
	parked    string // $1 limit → seq, id, destination, key, attempts, parked_at, reason
	sent      string // $1 after seq, $2 from, $3 to, $4 destination ("" any), $5 limit → rows as read
	dbNow     string // → now
	shardsNow string // → the shard count stored
}

var dollarParam = regexp.MustCompile(`\$(\d+)`)

// newStatements renders the statements of dialect ("postgres" or "sqlite")
// for the outbox table t.
func newStatements(dialect string, t inboxdb.Table) *statements {
	q, leases, relays, meta := t.Quoted(), t.Sibling(t.Name+"_leases"), t.Sibling(t.Name+"_relays"), t.Sibling(t.Name+"_meta")
	s := &statements{name: dialect}
	var now, plusMs, inList, forShare, skipLocked string
	switch dialect {
	case "postgres":
		s.migrations = "migrations/postgres"
		s.timeArg = func(t time.Time) any { return t }
		s.scanTime = scanPostgresTime
		s.list = func(v []int64) any { return v }
		s.missing = func(err error) bool {
			var pe *pgconn.PgError
			return errors.As(err, &pe) && pe.Code == "42P01"
		}
		now = "now()"
		plusMs = func() string { return "now() + $%d * interval '1 millisecond'" }()
		inList = "= ANY($%d)"
		forShare, skipLocked = " FOR SHARE", " FOR UPDATE SKIP LOCKED"
		// The lock space is the table's OID, not its spelling: one table
		// named two ways (idem_outbox, public.idem_outbox) locks a key once.
		s.lockKeys = `SELECT count(pg_advisory_xact_lock(hashtext($1::regclass::oid::text), h)) FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest($2::text[]) AS k ORDER BY 1) AS s`
		s.notify = `SELECT pg_notify($1, '')`
		s.insert = `INSERT INTO ` + q + ` (id, destination, routing_key, key, shard, headers, body, event_time, enqueued_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	case "sqlite":
		s.migrations = "migrations/sqlite"
		s.timeArg = func(t time.Time) any { return t.UTC().Format(sqliteTimeFormat) }
		s.scanTime = scanSQLiteTime
		s.list = func(v []int64) any {
			b := make([]string, len(v))
			for i, n := range v {
				b[i] = fmt.Sprint(n)
			}
			return "[" + strings.Join(b, ",") + "]"
		}
		s.missing = func(err error) bool {
			// SQLITE_ERROR has no code of its own for a missing table.
			var c interface{ Code() int }
			return errors.As(err, &c) && c.Code()&0xff == 1 && strings.Contains(err.Error(), "no such table")
		}
		now = `strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')`
		plusMs = `strftime('%%Y-%%m-%%dT%%H:%%M:%%f000Z', 'now', printf('%%+.3f seconds', $%d / 1000.0))`
		inList = "IN (SELECT value FROM json_each($%d))"
		s.insert = `INSERT INTO ` + q + ` (id, destination, routing_key, key, shard, headers, body, event_time, enqueued_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	default:
		panic("outbox: unknown dialect " + dialect)
	}
	in := func(n int) string { return fmt.Sprintf(inList, n) }
	plus := func(n int) string { return fmt.Sprintf(plusMs, n) }

	s.meta = `CREATE TABLE IF NOT EXISTS ` + meta + ` (one integer PRIMARY KEY CHECK (one = 1), version integer NOT NULL, shards integer NOT NULL)`
	s.readMeta = `SELECT version, shards FROM ` + meta
	s.insertMeta = `INSERT INTO ` + meta + ` (one, version, shards) VALUES (1, $1, $2)`
	s.updateMeta = `UPDATE ` + meta + ` SET version = $1`
	s.shardsNow = `SELECT shards FROM ` + meta
	s.insertLease = `INSERT INTO ` + leases + ` (shard, expires_at) VALUES ($1, $2) ON CONFLICT (shard) DO NOTHING`

	// A row is read when it is unsent, unparked and due, and no earlier
	// row of its key holds it back: one waiting after a refusal, or (with
	// StrictOrder) one parked. Rows without a key are not ordered.
	read := func(strict bool) string {
		held := `w.parked_at IS NULL AND w.available_at > ` + now
		if strict {
			held = `(` + held + `) OR w.parked_at IS NOT NULL`
		}
		return `SELECT o.seq, o.id, o.destination, o.routing_key, o.key, o.headers, o.body, o.event_time, o.attempts, o.shard FROM ` + q + ` AS o
WHERE o.shard ` + in(1) + ` AND o.sent_at IS NULL AND o.parked_at IS NULL
  AND (o.available_at IS NULL OR o.available_at <= ` + now + `)
  AND (o.key = '' OR NOT EXISTS (SELECT 1 FROM ` + q + ` AS w
      WHERE w.shard = o.shard AND w.key = o.key AND w.seq < o.seq AND w.sent_at IS NULL
        AND (w.available_at IS NOT NULL OR w.parked_at IS NOT NULL) AND (` + held + `)))
ORDER BY o.seq LIMIT $2`
	}
	s.read, s.readStrict = read(false), read(true)
	s.validLeases = `SELECT shard, epoch FROM ` + leases + ` WHERE owner = $1 AND expires_at > ` + now + forShare
	s.markSent = `UPDATE ` + q + ` SET sent_at = ` + now + `, attempts = attempts + 1, last_error = NULL, available_at = NULL WHERE seq ` + in(1) + ` AND sent_at IS NULL`
	s.markRefused = `UPDATE ` + q + ` SET attempts = attempts + 1, last_error = $2, available_at = ` + plus(3) + `,
  parked_at = CASE WHEN attempts + 1 >= $4 THEN ` + now + ` END,
  parked_reason = CASE WHEN attempts + 1 >= $4 THEN $2 END
WHERE seq = $1 AND sent_at IS NULL RETURNING parked_at IS NOT NULL`
	s.presence = `INSERT INTO ` + relays + ` (owner, seen_until) VALUES ($1, ` + plus(2) + `) ON CONFLICT (owner) DO UPDATE SET seen_until = excluded.seen_until`
	s.absent = `DELETE FROM ` + relays + ` WHERE owner = $1 OR seen_until < ` + now
	s.forget = `DELETE FROM ` + relays + ` WHERE seen_until < ` + plus(1)
	s.liveRelays = `SELECT count(*) FROM ` + relays + ` WHERE owner <> $1 AND seen_until > ` + now
	s.claim = `UPDATE ` + leases + ` SET owner = $1, epoch = epoch + 1, expires_at = ` + plus(2) + `
WHERE shard IN (SELECT shard FROM ` + leases + ` WHERE expires_at < ` + now + ` ORDER BY shard LIMIT $3` + skipLocked + `)
RETURNING shard, epoch`
	s.renew = `UPDATE ` + leases + ` SET expires_at = ` + plus(2) + ` WHERE owner = $1 RETURNING shard, epoch`
	s.release = `UPDATE ` + leases + ` SET owner = '', expires_at = $3 WHERE owner = $1 AND shard ` + in(2)

	s.stats = `SELECT destination,
  sum(CASE WHEN sent_at IS NULL AND parked_at IS NULL THEN 1 ELSE 0 END),
  min(CASE WHEN sent_at IS NULL AND parked_at IS NULL THEN enqueued_at END),
  sum(CASE WHEN parked_at IS NOT NULL THEN 1 ELSE 0 END),
  sum(CASE WHEN sent_at IS NOT NULL THEN 1 ELSE 0 END)
FROM ` + q + ` GROUP BY destination ORDER BY destination`
	s.prune = `DELETE FROM ` + q + ` WHERE seq IN (SELECT seq FROM ` + q + ` WHERE sent_at < $1 ORDER BY sent_at LIMIT $2)`
	s.prunable = `SELECT count(*) FROM ` + q + ` WHERE sent_at < $1`
	s.unpark = `UPDATE ` + q + ` SET parked_at = NULL, parked_reason = NULL, attempts = 0, available_at = NULL
WHERE parked_at IS NOT NULL AND sent_at IS NULL AND ($1 = '' OR destination = $1) AND ($2 = '' OR key = $2) AND ($3 = '' OR id = $3)`
	s.parked = `SELECT seq, id, destination, key, attempts, parked_at, parked_reason FROM ` + q + ` WHERE parked_at IS NOT NULL AND sent_at IS NULL ORDER BY seq LIMIT $1`
	s.sent = `SELECT seq, id, destination, routing_key, key, headers, body, event_time, attempts, shard FROM ` + q + `
WHERE seq > $1 AND sent_at IS NOT NULL AND event_time >= $2 AND event_time < $3 AND ($4 = '' OR destination = $4)
ORDER BY seq LIMIT $5`
	s.dbNow = `SELECT ` + now

	if dialect == "sqlite" {
		for _, p := range []*string{&s.insert, &s.readMeta, &s.insertMeta, &s.updateMeta, &s.insertLease,
			&s.read, &s.readStrict, &s.validLeases, &s.markSent, &s.markRefused, &s.presence, &s.absent, &s.forget,
			&s.liveRelays, &s.claim, &s.renew, &s.release, &s.prune, &s.prunable, &s.unpark, &s.parked, &s.sent} {
			*p = dollarParam.ReplaceAllString(*p, "?$1")
		}
	}
	return s
}

func scanPostgresTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case nil:
		return time.Time{}, nil
	case time.Time:
		return t, nil
	}
	return time.Time{}, fmt.Errorf("unexpected time value %T", v)
}

func scanSQLiteTime(v any) (time.Time, error) {
	var s string
	switch t := v.(type) {
	case nil:
		return time.Time{}, nil
	case string:
		s = t
	case []byte:
		s = string(t)
	case time.Time:
		return t, nil
	default:
		return time.Time{}, fmt.Errorf("unexpected time value %T", v)
	}
	return time.Parse(sqliteTimeFormat, s)
}
