package pgxinbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemstore/storetest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// TestRetentionConformance runs the shared retention checks on both
// layouts.
func TestRetentionConformance(t *testing.T) {
	for _, layout := range []pgxinbox.Layout{pgxinbox.Plain, pgxinbox.Partitioned} {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			storetest.RunRetention(t, storetest.RetentionHarness[pgx.Tx]{Open: func(t *testing.T, conns int) storetest.RetentionEnv[pgx.Tx] {
				return retentionEnv(t, layout, conns)
			}})
		})
	}
}

func retentionEnv(t *testing.T, layout pgxinbox.Layout, conns int) storetest.RetentionEnv[pgx.Tx] {
	ctx := context.Background()
	pool := pgtest.PoolOf(t, conns)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (consumer text, key text, message_id text)`); err != nil {
		t.Fatal(err)
	}
	return storetest.RetentionEnv[pgx.Tx]{
		Env: storetest.Env[pgx.Tx]{
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
		},
		Store: store,
		Reopen: func(t *testing.T, window time.Duration) storetest.RetentionStore[pgx.Tx] {
			s, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: layout, Window: window})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		SetTimes: func(ctx context.Context, consumer, key string, processedAt, keepUntil time.Time) error {
			_, err := pool.Exec(ctx, `UPDATE idem_inbox SET processed_at = $3, keep_until = $4 WHERE consumer = $1 AND key = $2`, consumer, key, processedAt, keepUntil)
			return err
		},
	}
}
