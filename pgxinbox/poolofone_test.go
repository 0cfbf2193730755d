package pgxinbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// poolOf opens a pool of at most n connections on a fresh, migrated
// schema.
func poolOf(t *testing.T, n int32) (*pgxpool.Pool, *pgxinbox.Store) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return pool, store
}

// A handler whose own deadline cuts its query short, on a pool whose every
// connection is held by such a handler (one worker on a pool of one, N on a
// pool of N timing out together): the database answers, so the message is
// at fault and ends in a dead letter, instead of being held forever
// because the outage test could not get a connection.
func TestHandlersOwnDeadlineOnAFullPoolIsTheMessagesFailure(t *testing.T) {
	for _, workers := range []int{1, 3} {
		for _, natural := range []bool{false, true} {
			t.Run(fmt.Sprintf("workers=%d/natural=%v", workers, natural), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				_, store := poolOf(t, int32(workers))
				cfg := &idem.Config[pgx.Tx]{
					Consumer: "slow", Natural: natural, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
					Handler: func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
						qctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
						defer cancel()
						_, err := tx.Exec(qctx, `SELECT pg_sleep(1)`)
						return err
					},
					Retry: idem.RetryPolicy{MaxAttempts: 2, WaitUnavailable: 200 * time.Millisecond},
				}
				if !natural {
					cfg.Key = idem.ByMessageID
				}
				p, err := idem.NewProcessor(store, cfg)
				if err != nil {
					t.Fatal(err)
				}
				results := make([]idem.Result, workers)
				var wg sync.WaitGroup
				for i := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						results[i] = p.Process(ctx, idem.Message{ID: fmt.Sprintf("slow-%d", i), Body: []byte("x"), Time: time.Now()})
					}()
				}
				wg.Wait()
				for _, res := range results {
					if res.Outcome != idem.DeadLettered || res.Blameless || errors.Is(res.Err, idem.ErrUnavailable) {
						t.Errorf("%s: outcome %v blameless %v attempts %d err %v; want a dead letter charged to the message", res.MessageID, res.Outcome, res.Blameless, res.Attempts, res.Err)
					}
				}
			})
		}
	}
}
