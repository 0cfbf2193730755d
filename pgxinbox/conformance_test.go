package pgxinbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemstore/storetest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

func TestConformance(t *testing.T) {
	conformance(t, pgxinbox.Plain, func(s *pgxinbox.Store) idemstore.Store[pgx.Tx] { return s })
}

// conformance runs the shared store suite on a fresh schema per subtest,
// with a layout; wrap may adapt the store (see TestPartitionedConformance).
// The effects table has no unique constraint, so a double application shows.
func conformance(t *testing.T, layout pgxinbox.Layout, wrap func(*pgxinbox.Store) idemstore.Store[pgx.Tx]) {
	env := func(pool *pgxpool.Pool, store *pgxinbox.Store) storetest.Env[pgx.Tx] {
		return storetest.Env[pgx.Tx]{
			Store: wrap(store),
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
	}
	storetest.Run(t, storetest.Harness[pgx.Tx]{
		LockTimeout: true,
		Open: func(t *testing.T, conns int) storetest.Env[pgx.Tx] {
			return env(openLayoutOf(t, layout, nil, conns))
		},
		OpenBehindFault: func(t *testing.T, conns int) (storetest.Env[pgx.Tx], storetest.Fault) {
			pool, proxy := pgtest.PoolBehindFaultOf(t, conns)
			return env(pool, migrated(t, pool, layout)), proxy
		},
	})
}

// migrated is a store of layout on pool, migrated, with the effects table.
func migrated(t *testing.T, pool *pgxpool.Pool, layout pgxinbox.Layout) *pgxinbox.Store {
	t.Helper()
	ctx := context.Background()
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: layout, Window: window})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text, key text, message_id text)`); err != nil {
		t.Fatal(err)
	}
	return store
}
