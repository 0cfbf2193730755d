package pgxinbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/inboxtest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// open returns a migrated store on a fresh schema with an effects table that
// has no unique constraint, so a double application would show.
func open(t testing.TB) (*pgxpool.Pool, *pgxinbox.Store) {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text, key text, message_id text)`); err != nil {
		t.Fatal(err)
	}
	return pool, store
}

func TestConformance(t *testing.T) {
	inboxtest.Run(t, inboxtest.Harness[pgx.Tx]{
		LockTimeout: true,
		Open: func(t *testing.T) inboxtest.Env[pgx.Tx] {
			pool, store := open(t)
			return inboxtest.Env[pgx.Tx]{
				Store: store,
				Apply: func(ctx context.Context, tx pgx.Tx, consumer, key, id string) error {
					_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2, $3)`, consumer, key, id)
					return err
				},
				Effects: func(ctx context.Context, consumer, key string) (n int, err error) {
					err = pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE consumer = $1 AND ($2 = '' OR key = $2)`, consumer, key).Scan(&n)
					return n, err
				},
				Markers: func(ctx context.Context, consumer string) (n int, err error) {
					err = pool.QueryRow(ctx, `SELECT count(*) FROM idem_inbox WHERE consumer = $1`, consumer).Scan(&n)
					return n, err
				},
				Begin:    store.Begin,
				Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
				Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
			}
		},
	})
}
