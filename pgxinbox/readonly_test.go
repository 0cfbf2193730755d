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
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// TestReadOnlyServerIsAnOutage: a pool whose sessions land on a server that
// cannot write (default_transaction_read_only, how a failover fences a
// demoted primary; a hot standby answers the same 25006) holds the message
// as an outage, spending none of its attempts, and drops every such
// session instead of giving it back to the pool, so each try dials again
// (where target_session_attrs=read-write would find the new primary). Both
// a claiming and a natural consumer, whose handler meets the refusal first.
func TestReadOnlyServerIsAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Schema(t)
	rw, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	setup, err := pgxinbox.New(rw, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(ctx, `CREATE TABLE effects (message_id text)`); err != nil {
		t.Fatal(err)
	}
	for _, natural := range []bool{false, true} {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
		ro, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer ro.Close()
		store, err := pgxinbox.New(ro, nil)
		if err != nil {
			t.Fatal(err)
		}
		c := &idem.Config[pgx.Tx]{
			Consumer: "readonly",
			Key:      idem.ByMessageID,
			Handler: func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
				_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, m.ID)
				return err
			},
			// One attempt: a failure charged to the message dead-letters it.
			Retry:  idem.RetryPolicy{MaxAttempts: 1, WaitUnavailable: 300 * time.Millisecond},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		if natural {
			c.Consumer, c.Key, c.Natural = "readonly-natural", nil, true
		}
		proc, err := idem.NewProcessor(store, c)
		if err != nil {
			t.Fatal(err)
		}
		res := proc.Process(ctx, idem.Message{ID: "m-1", Body: []byte("x"), Time: time.Now()})
		if res.Outcome != idem.Retry || !res.Blameless || !errors.Is(res.Err, idem.ErrUnavailable) {
			t.Fatalf("natural=%v: outcome %v blameless %v err %v; want a blameless Retry wrapping ErrUnavailable", natural, res.Outcome, res.Blameless, res.Err)
		}
		if res.Attempts < 2 {
			t.Fatalf("natural=%v: %d tries; want the outage waited out with several", natural, res.Attempts)
		}
		// Every try dialed a session of its own: none was given back.
		if st := ro.Stat(); st.NewConnsCount() < int64(res.Attempts) || st.IdleConns() != 0 {
			t.Fatalf("natural=%v: %d tries, %d connections dialed, %d idle; want every read-only session dropped", natural, res.Attempts, st.NewConnsCount(), st.IdleConns())
		}
	}
	var n int
	if err := rw.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("effects %d (%v), want none", n, err)
	}
}
