package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/inboxdb"
	"github.com/idemkit/idem/internal/pgerr"
)

// Dialect is the SQL flavour of the database behind a [Store]: [Postgres] or
// [SQLite]. Its methods are unexported so that the set of dialects stays
// inside this package, where each is tested against a real database. The
// statements themselves live in package internal/inboxdb, one file per
// dialect, shared with pgxinbox.
type Dialect interface {
	// Name is the dialect's name: "postgres" or "sqlite".
	Name() string

	// statements is the dialect's SQL for table t.
	statements(t inboxdb.Table) *inboxdb.Dialect
	// driver is the shared logic's seam over db.
	driver(db *sql.DB) inboxdb.Driver
	// maxParams is the most bind parameters one statement may carry.
	maxParams() int
	// schemas says whether table names may be schema-qualified.
	schemas() bool
	// setLockTimeout bounds the claim's wait on a concurrent holder, for the
	// rest of tx.
	setLockTimeout(ctx context.Context, tx *sql.Tx, d time.Duration) error
	// commitUnknown reports whether a failed COMMIT may nevertheless have
	// committed.
	commitUnknown(err error) bool
	// classify implements [idemstore.Store.Classify].
	classify(err error) idemstore.ErrorClass
	// durability implements [Store.Durability].
	durability(ctx context.Context, db *sql.DB) (idemstore.Durability, error)
}

// Postgres is the PostgreSQL dialect, for a *sql.DB opened with the pgx
// stdlib driver (import _ "github.com/jackc/pgx/v5/stdlib"; sql.Open("pgx", url)):
// its claim binds arrays, which that driver passes to pgx as they are.
var Postgres Dialect = postgres{}

// SQLite is the SQLite dialect, for a *sql.DB opened with modernc.org/sqlite,
// best through sqliteinbox.Open (a package of its own, so PostgreSQL users do not link SQLite).
var SQLite Dialect = sqlite{}

type postgres struct{}

func (postgres) Name() string   { return "postgres" }
func (postgres) String() string { return "postgres" }
func (postgres) maxParams() int { return 65535 }
func (postgres) schemas() bool  { return true }
func (postgres) statements(t inboxdb.Table) *inboxdb.Dialect {
	return inboxdb.Postgres(t, idemstore.LayoutPlain)
}
func (postgres) driver(db *sql.DB) inboxdb.Driver { return inboxdb.SQL(db, false) }

func (postgres) setLockTimeout(ctx context.Context, tx *sql.Tx, d time.Duration) error {
	ms := max(d.Milliseconds(), 1) // 0 would mean no limit
	// is_local=true: the setting ends with the transaction, so a pooled
	// connection does not keep it.
	_, err := tx.ExecContext(ctx, "SELECT set_config('lock_timeout', $1, true)", strconv.FormatInt(ms, 10)+"ms")
	return err
}

func (postgres) commitUnknown(err error) bool { return pgerr.CommitUnknown(err) }

func (postgres) classify(err error) idemstore.ErrorClass { return pgerr.Classify(err) }

func (postgres) durability(ctx context.Context, db *sql.DB) (idemstore.Durability, error) {
	var syncCommit, standbyNames, fsync string
	var recovery bool
	var standbys, syncStandbys int
	if err := db.QueryRowContext(ctx, inboxdb.PostgresDurabilitySQL).Scan(&syncCommit, &standbyNames, &fsync, &recovery, &standbys, &syncStandbys); err != nil {
		return idemstore.Durability{}, err
	}
	return inboxdb.PostgresDurability(syncCommit, standbyNames, fsync, recovery, standbys, syncStandbys), nil
}

// durability reads the pragmas of one pooled connection: sqliteinbox.Open
// sets them on every connection alike.
func (sqlite) durability(ctx context.Context, db *sql.DB) (idemstore.Durability, error) {
	var synchronous int
	var journal string
	if err := db.QueryRowContext(ctx, "SELECT synchronous, journal_mode FROM pragma_synchronous, pragma_journal_mode").Scan(&synchronous, &journal); err != nil {
		return idemstore.Durability{}, err
	}
	return inboxdb.SQLiteDurability(synchronous, journal), nil
}

type sqlite struct{}

func (sqlite) Name() string   { return "sqlite" }
func (sqlite) String() string { return "sqlite" }

// maxParams is SQLITE_MAX_VARIABLE_NUMBER as modernc.org/sqlite compiles it.
func (sqlite) maxParams() int                              { return 32766 }
func (sqlite) schemas() bool                               { return false }
func (sqlite) statements(t inboxdb.Table) *inboxdb.Dialect { return inboxdb.SQLite(t) }
func (sqlite) driver(db *sql.DB) inboxdb.Driver            { return inboxdb.SQL(db, true) }

func (sqlite) setLockTimeout(context.Context, *sql.Tx, time.Duration) error {
	// SQLite has no row locks to wait on: writers queue for the database
	// lock, bounded by busy_timeout (set by sqliteinbox.Open).
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

func (sqlite) classify(err error) idemstore.ErrorClass {
	var c sqliteCoder
	if !errors.As(err, &c) {
		return idemstore.ClassTransient
	}
	switch c.Code() & 0xff {
	case sqliteConstraint, sqliteMismatch, sqliteTooBig:
		return idemstore.ClassPermanent
	case sqliteBusy, sqliteLocked:
		// Another writer held the database past busy_timeout: contention,
		// not the message's doing.
		return idemstore.ClassBusy
	}
	// Everything else: let the retry policy decide.
	return idemstore.ClassTransient
}
