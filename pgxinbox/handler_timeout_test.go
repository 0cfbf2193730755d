package pgxinbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// A handler that bounds its own query with a deadline of its own makes pgx
// close the connection when the deadline fires. That is the handler's
// failure, not an outage: it spends the message's attempts and ends in a
// dead letter, instead of being held (and its partition with it) forever.
func TestHandlersOwnDeadlineIsTheMessagesFailure(t *testing.T) {
	ctx := context.Background()
	for _, natural := range []bool{false, true} {
		name := "claiming"
		if natural {
			name = "natural"
		}
		t.Run(name, func(t *testing.T) {
			pool, err := pgxpool.New(ctx, pgtest.Schema(t))
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
			res := p.Process(ctx, idem.Message{ID: "slow-1", Body: []byte("x"), Time: time.Now()})
			if res.Outcome != idem.DeadLettered || res.Blameless || errors.Is(res.Err, idem.ErrUnavailable) {
				t.Fatalf("outcome %v blameless %v attempts %d err %v; want a dead letter charged to the message", res.Outcome, res.Blameless, res.Attempts, res.Err)
			}
		})
	}
}

// The same deadline fired because the database stopped answering (a proxy
// that goes silent mid-query): the ping finds no database, and the message
// is held as an outage, its attempts unspent, and applied once the
// database answers again.
func TestHandlersOwnDeadlineOnASilentDatabaseIsAnOutage(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Schema(t)
	direct, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	migrated, err := pgxinbox.New(direct, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrated.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	proxy := netfault.New(t, "127.0.0.1:5432")
	pool, err := pgxpool.New(ctx, proxy.URL(t, url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "silent", Natural: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
			calls++
			if calls == 1 {
				proxy.Freeze() // the database goes silent under the query
			}
			qctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, err := tx.Exec(qctx, `SELECT 1`)
			return err
		},
		Retry:     idem.RetryPolicy{MaxAttempts: 1, WaitUnavailable: 300 * time.Millisecond},
		TxTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(2 * time.Second)
		proxy.Restore()
	}()
	res := p.Process(ctx, idem.Message{ID: "silent-1", Body: []byte("x"), Time: time.Now()})
	if res.Outcome != idem.Applied || calls < 2 {
		t.Fatalf("outcome %v after %d calls (err %v); want the outage held, not charged (a budget of one), and the message applied once the database answers", res.Outcome, calls, res.Err)
	}
}
