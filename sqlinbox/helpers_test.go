package sqlinbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// backend is one dialect under test with a way to get a fresh database.
type backend struct {
	name    string
	dialect sqlinbox.Dialect
	open    func(t testing.TB) *sql.DB
}

var backends = []backend{
	{"postgres", sqlinbox.Postgres, openPostgres},
	{"sqlite", sqlinbox.SQLite, openSQLite},
}

// openPostgres opens the pgx stdlib driver on a fresh schema.
func openPostgres(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", pgtest.Schema(t))
	if err != nil {
		t.Fatalf("opening PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// openSQLite opens a fresh database file in t's temporary directory.
func openSQLite(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sqliteinbox.Open(filepath.Join(t.TempDir(), "inbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// migrated returns a migrated store with the default table on db.
func migrated(t testing.TB, db *sql.DB, d sqlinbox.Dialect, cfg *sqlinbox.Config) *sqlinbox.Store {
	t.Helper()
	s, err := sqlinbox.New(db, d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func postgresDialect() sqlinbox.Dialect { return sqlinbox.Postgres }

// countRows counts the rows of table (a trusted name).
func countRows(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
		t.Fatalf("counting %s: %v", table, err)
	}
	return n
}
