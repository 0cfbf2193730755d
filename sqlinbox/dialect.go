package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/idemkit/idem/internal/pgerr"
	"strconv"
	"time"

	"github.com/idemkit/idem"
)

// Dialect is the SQL flavour of the database behind a [Store]: [Postgres] or
// [SQLite]. Its methods are unexported so that the set of dialects stays
// inside this package, where each is tested against a real database; MySQL
// is expected to be added behind the same seam (it lacks RETURNING, so its
// claim will need its own statement shape).
type Dialect interface {
	// Name is the dialect's name: "postgres" or "sqlite".
	Name() string

	// placeholder is the n-th (1-based) bind parameter. Statements bind
	// their parameters in order and never reuse one, so a dialect may
	// answer with a plain positional "?".
	placeholder(n int) string
	// maxParams is the most bind parameters one statement may carry.
	maxParams() int
	// nowColumn is the type and default of a "when it happened" column.
	nowColumn() string
	// schemas says whether table names may be schema-qualified.
	schemas() bool
	// migrationDir is the directory under migrations/ holding the dialect's
	// templates.
	migrationDir() string
	// beginMigration opens the transaction migrations run in, serialized
	// against other migrators of the same database.
	beginMigration(ctx context.Context, db *sql.DB) (*migrationTx, error)
	// setLockTimeout bounds the claim's wait on a concurrent holder, for the
	// rest of tx.
	setLockTimeout(ctx context.Context, tx *sql.Tx, d time.Duration) error
	// timeArg is how a time is bound as a parameter.
	timeArg(t time.Time) any
	// scanTime converts a scanned time column.
	scanTime(v any) (time.Time, error)
	// commitUnknown reports whether a failed COMMIT may nevertheless have
	// committed.
	commitUnknown(err error) bool
	// classify implements [idem.Store.Classify].
	classify(err error) idem.ErrorClass
}

// Postgres is the PostgreSQL dialect, for a *sql.DB opened with the pgx
// stdlib driver (import _ "github.com/jackc/pgx/v5/stdlib"; sql.Open("pgx", url)).
var Postgres Dialect = postgres{}

// SQLite is the SQLite dialect, for a *sql.DB opened with modernc.org/sqlite,
// best through [OpenSQLite].
var SQLite Dialect = sqlite{}

type postgres struct{}

func (postgres) Name() string             { return "postgres" }
func (postgres) placeholder(n int) string { return "$" + strconv.Itoa(n) }
func (postgres) maxParams() int           { return 65535 }
func (postgres) nowColumn() string        { return "timestamptz NOT NULL DEFAULT now()" }
func (postgres) schemas() bool            { return true }
func (postgres) migrationDir() string     { return "postgres" }
func (postgres) timeArg(t time.Time) any  { return t }
func (postgres) String() string           { return "postgres" }
func (postgres) scanTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case time.Time:
		return t, nil
	case nil:
		return time.Time{}, nil
	}
	return time.Time{}, fmt.Errorf("scanning time: unexpected %T", v)
}

func (postgres) beginMigration(ctx context.Context, db *sql.DB) (*migrationTx, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	// Held until the transaction ends: a second migrator waits here, then
	// finds the version the first one recorded.
	// The key is the one pgxinbox takes, whatever the table: the bookkeeping
	// table is shared, CREATE TABLE IF NOT EXISTS is not safe against a
	// concurrent creator, and both stores migrate the same schema.
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext('idem.migrate'))"); err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("taking migration lock: %w", err)
	}
	return &migrationTx{q: tx, commit: tx.Commit, rollback: tx.Rollback}, nil
}

func (postgres) setLockTimeout(ctx context.Context, tx *sql.Tx, d time.Duration) error {
	ms := max(d.Milliseconds(), 1) // 0 would mean no limit
	// is_local=true: the setting ends with the transaction, so a pooled
	// connection does not keep it.
	_, err := tx.ExecContext(ctx, "SELECT set_config('lock_timeout', $1, true)", strconv.FormatInt(ms, 10)+"ms")
	return err
}

func (postgres) commitUnknown(err error) bool { return pgerr.CommitUnknown(err) }

func (postgres) classify(err error) idem.ErrorClass { return pgerr.Classify(err) }

// sqliteTimeFormat is fixed-width UTC with microseconds, so stored times sort
// and compare correctly as text.
const sqliteTimeFormat = "2006-01-02T15:04:05.000000Z"

type sqlite struct{}

func (sqlite) Name() string   { return "sqlite" }
func (sqlite) String() string { return "sqlite" }

// placeholder is a plain "?": with numbered ones (?NNN) the driver looks up
// each parameter's name in a list, which made a claim of 8,000 rows take
// seconds instead of milliseconds.
func (sqlite) placeholder(int) string { return "?" }

// maxParams is SQLITE_MAX_VARIABLE_NUMBER as modernc.org/sqlite compiles it.
func (sqlite) maxParams() int { return 32766 }
func (sqlite) schemas() bool  { return false }
func (sqlite) nowColumn() string {
	// SQLite's clock has milliseconds; three zeros give the fixed width
	// of sqliteTimeFormat.
	return "TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))"
}
func (sqlite) migrationDir() string { return "sqlite" }
func (sqlite) timeArg(t time.Time) any {
	return t.UTC().Format(sqliteTimeFormat)
}

func (sqlite) scanTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case nil:
		return time.Time{}, nil
	case string:
		return time.Parse(sqliteTimeFormat, t)
	case []byte:
		return time.Parse(sqliteTimeFormat, string(t))
	case time.Time:
		return t, nil
	}
	return time.Time{}, fmt.Errorf("scanning time: unexpected %T", v)
}

func (sqlite) beginMigration(ctx context.Context, db *sql.DB) (*migrationTx, error) {
	// BEGIN IMMEDIATE takes the write lock at once, whatever _txlock the DSN
	// says, so two migrators queue (busy_timeout) instead of both reading
	// version 0. database/sql does not know of this transaction, so it runs
	// on one pinned connection.
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("beginning immediate transaction: %w", err)
	}
	end := func(stmt string) error {
		_, err := conn.ExecContext(context.Background(), stmt)
		if err != nil {
			// Never hand a connection with an open transaction back to the
			// pool: discard it.
			_ = conn.Raw(func(any) error { return errBadConn })
		}
		return errors.Join(err, conn.Close())
	}
	return &migrationTx{
		q:        conn,
		commit:   func() error { return end("COMMIT") },
		rollback: func() error { return end("ROLLBACK") },
	}, nil
}

func (sqlite) setLockTimeout(context.Context, *sql.Tx, time.Duration) error {
	// SQLite has no row locks to wait on: writers queue for the database
	// lock, bounded by busy_timeout (set by OpenSQLite).
	return nil
}

// sqliteCoder is implemented by modernc.org/sqlite's *Error; asking for the
// behaviour rather than the type keeps the classification free of the
// driver's concrete types.
type sqliteCoder interface{ Code() int }

// Primary SQLite result codes (the low byte of an extended code).
const (
	sqliteBusy       = 5
	sqliteLocked     = 6
	sqliteTooBig     = 18
	sqliteConstraint = 19
	sqliteMismatch   = 20
)

func (sqlite) commitUnknown(error) bool {
	// SQLite commits in-process: a failed COMMIT did not commit (the
	// transaction is still open or rolled back), never "maybe".
	return false
}

func (sqlite) classify(err error) idem.ErrorClass {
	var c sqliteCoder
	if !errors.As(err, &c) {
		return idem.ClassTransient
	}
	switch c.Code() & 0xff {
	case sqliteConstraint, sqliteMismatch, sqliteTooBig:
		return idem.ClassPermanent
	}
	// SQLITE_BUSY and SQLITE_LOCKED: another writer held the database past
	// busy_timeout. Everything else too: let the retry policy decide.
	return idem.ClassTransient
}
