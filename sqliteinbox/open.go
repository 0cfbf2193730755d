// Package sqliteinbox opens a SQLite database for an idem inbox: the driver
// (modernc.org/sqlite, pure Go, no cgo), set up for concurrent writers, and
// the SQLite dialect of package sqlinbox. It is a package of its own so that
// a PostgreSQL user of sqlinbox does not link SQLite into their binary.
//
//	db, err := sqliteinbox.Open("billing.db")
//	...
//	store, err := sqliteinbox.New(db, &sqlinbox.Config{})
package sqliteinbox

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/idemkit/idem/sqlinbox"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Dialect is the SQLite dialect of package sqlinbox, for a database opened
// with [Open].
var Dialect = sqlinbox.SQLite

// New returns a sqlinbox store on db, a database opened with [Open]:
// sqlinbox.New(db, sqlinbox.SQLite, cfg).
func New(db *sql.DB, cfg *sqlinbox.Config) (*sqlinbox.Store, error) {
	return sqlinbox.New(db, sqlinbox.SQLite, cfg)
}

// Open opens the SQLite database file at path with modernc.org/sqlite
// (pure Go, no cgo), set up for an inbox with concurrent writers:
//
//   - journal_mode(WAL): readers do not block the writer, nor it them.
//   - busy_timeout(5000): a connection that finds the database locked waits
//     up to 5 s for it instead of failing with SQLITE_BUSY at once.
//   - _txlock=immediate: every transaction takes the write lock at BEGIN. A
//     deferred transaction reads first and upgrades to a write lock at its
//     INSERT; when two do that at once, SQLite cannot wait for the other
//     (it would deadlock) and fails one with SQLITE_BUSY regardless of
//     busy_timeout. Taking the lock at BEGIN makes writers queue instead.
//   - foreign_keys(1): so handlers' foreign keys are enforced, as on
//     PostgreSQL.
//   - synchronous(NORMAL): durable across application crashes in WAL mode;
//     a power loss may lose the last commits, never corrupt the file.
//
// The caller closes the returned *sql.DB.
func Open(path string) (*sql.DB, error) {
	if path == "" {
		return nil, errors.New("opening SQLite: path is empty")
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("opening SQLite: path %q must not contain ? or #", path)
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	// A plain path (not a file: URI) is taken literally, so names with % or
	// spaces need no escaping; the driver strips the query before opening.
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("opening SQLite %s: %w", path, err)
	}
	// sql.Open connects lazily: fail here, with the path in the message, if
	// the file cannot be opened or the pragmas are refused.
	if err := db.Ping(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("opening SQLite %s: %w", path, err)
	}
	return db, nil
}
