package pgxinbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inboxtest"
	"github.com/idemkit/idem/pgxinbox"
)

func TestConformance(t *testing.T) {
	conformance(t, pgxinbox.Plain, func(s *pgxinbox.Store) idem.Store[pgx.Tx] { return s })
}

// conformance runs the shared store suite on a fresh schema per subtest,
// with a layout; wrap may adapt the store (see TestPartitionedConformance).
// The effects table has no unique constraint, so a double application shows.
func conformance(t *testing.T, layout pgxinbox.Layout, wrap func(*pgxinbox.Store) idem.Store[pgx.Tx]) {
	inboxtest.Run(t, inboxtest.Harness[pgx.Tx]{
		LockTimeout: true,
		Open: func(t *testing.T) inboxtest.Env[pgx.Tx] {
			pool, store := openLayout(t, layout, nil)
			return inboxtest.Env[pgx.Tx]{
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
		},
	})
}
