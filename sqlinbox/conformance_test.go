package sqlinbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemkit/idem/idemstore/storetest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/pooltest"
	"github.com/idemkit/idem/sqlinbox"
)

// TestConformance runs the shared inbox suite on both dialects. The effects
// table has no unique constraint, so a second application would show.
func TestConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, storetest.Harness[*sql.Tx]{
				// SQLite serializes writers on the database lock (busy_timeout)
				// instead of waiting on a row lock.
				LockTimeout:     b.dialect == sqlinbox.Postgres,
				Open:            func(t *testing.T, conns int) storetest.Env[*sql.Tx] { return env(t, b, conns) },
				OpenBehindFault: behindFault(b),
			})
		})
	}
}

// behindFault opens PostgreSQL through a proxy the suite can stop; SQLite
// has no network to fail.
func behindFault(b backend) func(*testing.T, int) (storetest.Env[*sql.Tx], storetest.Fault) {
	if b.dialect != sqlinbox.Postgres {
		return nil
	}
	return func(t *testing.T, conns int) (storetest.Env[*sql.Tx], storetest.Fault) {
		url, proxy := pgtest.SchemaBehindFault(t)
		b := b // the subtests run in parallel
		b.open = func(t testing.TB) *sql.DB {
			db, err := sql.Open("pgx", url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			return db
		}
		return env(t, b, conns), proxy
	}
}

// env is the suite's environment on a fresh database of b whose pool has
// at most conns connections (0: database/sql's default, unlimited).
func env(t *testing.T, b backend, conns int) storetest.Env[*sql.Tx] {
	e, _ := envDB(t, b, conns)
	return e
}

// envDB is env with its database.
func envDB(t *testing.T, b backend, conns int) (storetest.Env[*sql.Tx], *sql.DB) {
	ctx := context.Background()
	db := b.open(t)
	pooltest.SQL(t, db, conns)
	store := migrated(t, db, b.dialect, nil)
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (consumer text, key text, message_id text)`); err != nil {
		t.Fatal(err)
	}
	p := func(n string) string {
		if b.dialect == sqlinbox.SQLite {
			return "?" + n
		}
		return "$" + n
	}
	return storetest.Env[*sql.Tx]{
		Store: store,
		Apply: func(ctx context.Context, tx *sql.Tx, consumer, key, id string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES (`+p("1")+`, `+p("2")+`, `+p("3")+`)`, consumer, key, id)
			return err
		},
		Effects: func(ctx context.Context, consumer, key string) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE consumer = `+p("1")+` AND (`+p("2")+` = '' OR key = `+p("2")+`)`, consumer, key).Scan(&n)
			return n, err
		},
		Markers: func(ctx context.Context, consumer string) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM idem_inbox WHERE consumer = `+p("1"), consumer).Scan(&n)
			return n, err
		},
		Begin:    store.Begin,
		Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
	}, db
}
