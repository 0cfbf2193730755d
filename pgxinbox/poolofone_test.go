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

// ProcessTx on a pool of one: the caller's transaction holds the only
// connection, so the processor reads the stored settings in it; the first
// call, and a call after one that failed, apply their messages.
func TestProcessTxOnAPoolOfOne(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, store := poolOf(t, 1)
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id text)`); err != nil {
		t.Fatal(err)
	}
	fail := errors.New("handler refuses")
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "tx", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
			if string(m.Body) == "fail" {
				return fail
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, m.ID)
			return err
		},
		// Short, so that a read waiting for a second connection fails the
		// call in seconds rather than after the default 30 s.
		TxTimeout: 3 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	call := func(id, body string) (idem.Result, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.ProcessTx(ctx, tx, idem.Message{ID: id, Body: []byte(body), Time: time.Now()})
		if err != nil {
			_ = tx.Rollback(ctx)
			return res, err
		}
		return res, tx.Commit(ctx)
	}
	if res, err := call("m1", "ok"); err != nil || res.Outcome != idem.Applied {
		t.Fatalf("first call: outcome %v, error %v; want Applied", res.Outcome, err)
	}
	if _, err := call("m2", "fail"); !errors.Is(err, fail) {
		t.Fatalf("failing call: error %v, want the handler's", err)
	}
	for _, id := range []string{"m2", "m3"} {
		if res, err := call(id, "ok"); err != nil || res.Outcome != idem.Applied {
			t.Fatalf("call %s after a failure: outcome %v, error %v; want Applied", id, res.Outcome, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d effects (%v), want 3", n, err)
	}
}
