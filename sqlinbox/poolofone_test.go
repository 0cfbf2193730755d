package sqlinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlinbox"
)

// A handler whose own deadline cuts its query short on a pool of one: the
// database answers, so the message is at fault and ends in a dead letter,
// instead of being held forever because the outage test waited for the
// connection the failed transaction still held.
func TestHandlersOwnDeadlineOnAPoolOfOneIsTheMessagesFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := openPostgres(t)
	db.SetMaxOpenConns(1)
	store := migrated(t, db, sqlinbox.Postgres, nil)
	p, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
		Consumer: "slow", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, tx *sql.Tx, _ idem.Message) error {
			qctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err := tx.ExecContext(qctx, `SELECT pg_sleep(1)`)
			return err
		},
		Retry: idem.RetryPolicy{MaxAttempts: 2, WaitUnavailable: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	res := p.Process(ctx, idem.Message{ID: "slow-1", Body: []byte("x"), Time: time.Now()})
	if res.Outcome != idem.DeadLettered || res.Blameless || errors.Is(res.Err, idem.ErrUnavailable) {
		t.Fatalf("outcome %v blameless %v attempts %d err %v; want a dead letter charged to the message", res.Outcome, res.Blameless, res.Attempts, res.Err)
	}
}

// ProcessTx on a pool of one: the caller's transaction holds the only
// connection, so the processor reads the stored settings in it; the first
// call, and calls after one that failed, apply their messages.
func TestProcessTxOnAPoolOfOne(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db := b.open(t)
			db.SetMaxOpenConns(1)
			processTxOnAPoolOfOne(t, db, migrated(t, db, b.dialect, nil))
		})
	}
}

// processTxOnAPoolOfOne runs the calls of TestProcessTxOnAPoolOfOne on
// db, a pool of one connection, and store.
func processTxOnAPoolOfOne(t *testing.T, db *sql.DB, store *sqlinbox.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (id varchar(64))`); err != nil {
		t.Fatal(err)
	}
	fail := errors.New("handler refuses")
	p, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
		Consumer: "tx", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
			if string(m.Body) == "fail" {
				return fail
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ($1)`, m.ID)
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
		tx, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.ProcessTx(ctx, tx, idem.Message{ID: id, Body: []byte(body), Time: time.Now()})
		if err != nil {
			_ = tx.Rollback()
			return res, err
		}
		return res, tx.Commit()
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
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d effects (%v), want 3", n, err)
	}
}
