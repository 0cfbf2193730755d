package pgxinbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// A handler whose own transaction meets a lock another transaction holds
// for ever (lock_timeout, 55P03, on every try) is not blameless for ever:
// after RetryPolicy.MaxContention tries the contention spends the
// message's attempts, and the message is dead-lettered, saying it was the
// handler's transaction that met the contention, instead of holding its
// queue or partition.
func TestEndlessContentionIsDeadLettered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id int PRIMARY KEY, n int); INSERT INTO accounts VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(context.Background()) }()
	if _, err := holder.Exec(ctx, `SELECT * FROM accounts WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	runs := 0
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "accounts", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
			runs++
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '20ms'`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE accounts SET n = n + 1 WHERE id = 1`)
			return err
		},
		// Shorter than the tries contention takes: it must not end them
		// in a blameless hold.
		Retry: idem.RetryPolicy{MaxAttempts: 2, Backoff: idem.Backoff{Max: 50 * time.Millisecond}, WaitUnavailable: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	res := p.Process(ctx, idem.Message{ID: "locked-1", Body: []byte("x"), Time: time.Now()})
	if res.Outcome != idem.DeadLettered || res.Blameless || !errors.Is(res.Err, idem.ErrContention) || errors.Is(res.Err, idem.ErrBusy) {
		t.Fatalf("outcome %v blameless %v after %d runs: %v; want a dead letter for the handler's contention", res.Outcome, res.Blameless, runs, res.Err)
	}
	// The default bound (10 uncounted tries) and then the budget (2).
	if runs != 12 {
		t.Errorf("%d runs, want 12: 10 uncounted tries of contention, then MaxAttempts", runs)
	}
}
