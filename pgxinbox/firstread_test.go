package pgxinbox_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
)

// acquireWatch signals each acquire of a connection from the pool as it
// starts, before it waits for one.
type acquireWatch struct{ started chan struct{} }

func (w acquireWatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (w acquireWatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (w acquireWatch) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	select {
	case w.started <- struct{}{}:
	default:
	}
	return ctx
}
func (w acquireWatch) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {}

// TestProcessTxBesideAFirstReader: a fresh processor's first reads of the
// inbox settings and of the consumer's pause hold a lock while they wait
// for a connection. A ProcessTx caller holds a connection (its
// transaction): on a pool of one, it must not wait for that lock, or the
// reader waits for the caller's connection and the caller for the reader
// (docs/design.md 13). It reads in its own transaction instead, and both
// messages are applied.
func TestProcessTxBesideAFirstReader(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	watch := acquireWatch{started: make(chan struct{}, 1)}
	cfg.ConnConfig.Tracer = watch
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
		Consumer: "ledger", Key: idem.ByMessageID, TxTimeout: -1, Logger: slog.New(slog.DiscardHandler),
		Handler: func(context.Context, pgx.Tx, idem.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}

	// The caller's transaction holds the pool's only connection.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for len(watch.started) > 0 {
		<-watch.started
	}

	// A first reader takes the lock and waits for a connection.
	other := make(chan idem.Result, 1)
	go func() { other <- proc.Process(ctx, idem.Message{ID: "m-1"}) }()
	select {
	case <-watch.started:
	case <-time.After(30 * time.Second):
		t.Fatal("Process never asked the pool for a connection")
	}

	done := make(chan error, 1)
	go func() {
		r, err := proc.ProcessTx(ctx, tx, idem.Message{ID: "m-2"})
		if err == nil && r.Outcome != idem.Applied {
			t.Errorf("ProcessTx = %+v, want Applied", r)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ProcessTx: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("ProcessTx waited a minute for the first reader, which waits for ProcessTx's connection")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-other:
		if r.Outcome != idem.Applied {
			t.Fatalf("Process = %+v, want Applied", r)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Process did not end once the connection was free")
	}
}
