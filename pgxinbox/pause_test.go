package pgxinbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/pgxinbox"
)

// pauseHook records the pauses a processor reports.
type pauseHook struct {
	seen atomic.Pointer[idemstore.Pause]
}

func (h *pauseHook) OnPause(_ string, p idemstore.Pause) { h.seen.Store(&p) }

// A paused consumer holds every message: Process and ProcessBatch return a
// blameless Retry whose disposition is Hold, spend no attempt, run no
// handler and write no marker; ProcessTx refuses inside the caller's
// transaction. Another consumer of the same inbox goes on. Once resumed,
// the same messages are applied.
func TestPausedConsumerHoldsAndWritesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, store := poolOf(t, 4)
	var ran atomic.Int64
	hook := &pauseHook{}
	newProc := func(consumer string) *idem.Processor[pgx.Tx] {
		p, err := idem.NewProcessor(store, &idem.Config[pgx.Tx]{
			Consumer: consumer, Key: idem.ByMessageID, Hooks: []idem.Hook{hook},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Handler: func(context.Context, pgx.Tx, idem.Message) error {
				ran.Add(1)
				return nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	billing, other := newProc("billing"), newProc("other")

	if p, err := store.Paused(ctx, "billing"); err != nil || p.Paused {
		t.Fatalf("before any pause: %+v, %v", p, err)
	}
	p, already, err := store.Pause(ctx, "billing", "alice", "incident 42")
	if err != nil || already || !p.Paused || p.By != "alice" || p.Why != "incident 42" || p.Since.IsZero() {
		t.Fatalf("Pause = %+v, %v, %v", p, already, err)
	}
	if _, again, err := store.Pause(ctx, "billing", "bob", "again"); err != nil || !again {
		t.Fatalf("pausing a paused consumer: already=%v, %v", again, err)
	}

	msg := func(id string) idem.Message { return idem.Message{ID: id, Body: []byte(id)} }
	r := billing.Process(ctx, msg("m1"))
	if r.Outcome != idem.Retry || !r.Blameless || !errors.Is(r.Err, idem.ErrPaused) || r.Attempts != 0 {
		t.Fatalf("Process on a paused consumer = %+v", r)
	}
	var pe *idem.PausedError
	if !errors.As(r.Err, &pe) || pe.By != "alice" || pe.Why != "incident 42" {
		t.Fatalf("error %v does not say who paused and why", r.Err)
	}
	if d := billing.Dispose(r); d.Action != idem.ActionHold || d.Delay != idem.PauseHoldDelay {
		t.Fatalf("disposition = %+v, want hold after %v", d, idem.PauseHoldDelay)
	}
	for _, r := range billing.ProcessBatch(ctx, []idem.Message{msg("m2"), msg("m3")}) {
		if r.Outcome != idem.Retry || !errors.Is(r.Err, idem.ErrPaused) || billing.Dispose(r).Action != idem.ActionHold {
			t.Fatalf("ProcessBatch on a paused consumer = %+v", r)
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := billing.ProcessTx(ctx, tx, msg("m4")); !errors.Is(err, idem.ErrPaused) || r.Outcome != idem.Retry {
		t.Fatalf("ProcessTx on a paused consumer = %+v, %v", r, err)
	}
	_ = tx.Rollback(ctx)
	if got := billing.Paused(); !got.Paused || got.By != "alice" {
		t.Fatalf("Processor.Paused = %+v", got)
	}
	if s := hook.seen.Load(); s == nil || !s.Paused {
		t.Fatalf("PauseHook saw %+v", s)
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("the handler ran %d times for a paused consumer", n)
	}
	var markers int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_inbox WHERE consumer = 'billing'`).Scan(&markers); err != nil || markers != 0 {
		t.Fatalf("a paused consumer wrote %d markers (%v)", markers, err)
	}

	// Another consumer of the inbox is not paused.
	if r := other.Process(ctx, msg("m1")); r.Outcome != idem.Applied {
		t.Fatalf("another consumer = %+v", r)
	}
	ps, err := store.Pauses(ctx)
	if err != nil || len(ps) != 1 || ps[0].Consumer != "billing" || ps[0].By != "alice" {
		t.Fatalf("Pauses = %+v, %v", ps, err)
	}

	ended, err := store.Resume(ctx, "billing", "bob", "fixed")
	if err != nil || ended.By != "alice" {
		t.Fatalf("Resume = %+v, %v", ended, err)
	}
	if _, err := store.Resume(ctx, "billing", "bob", "twice"); !errors.Is(err, pgxinbox.ErrNotPaused) {
		t.Fatalf("resuming twice: %v", err)
	}
	// The processor reads the pause again within PauseTTL.
	deadline := time.Now().Add(time.Minute)
	for billing.Process(ctx, msg("m1")).Outcome != idem.Applied {
		if time.Now().After(deadline) {
			t.Fatal("still held a minute after the resume")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, r := range billing.ProcessBatch(ctx, []idem.Message{msg("m2"), msg("m3")}) {
		if r.Outcome != idem.Applied {
			t.Fatalf("after the resume: %+v", r)
		}
	}
	if s := hook.seen.Load(); s == nil || s.Paused {
		t.Fatalf("PauseHook saw %+v after the resume", s)
	}
	var log []string
	rows, err := pool.Query(ctx, `SELECT action || ' ' || actor || ' ' || reason FROM idem_consumer_pause_log ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	if log, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(log) != 2 || log[0] != "pause alice incident 42" || log[1] != "resume bob fixed" {
		t.Fatalf("audit rows = %q", log)
	}
}

// The pause is read in the caller's transaction without breaking it, even
// on an inbox migrated before the pauses tables existed.
func TestPauseReadOnInboxWithoutPausesTables(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, _ := poolOf(t, 2)
	if _, err := pool.Exec(ctx, `DROP TABLE idem_consumer_pauses, idem_consumer_pause_log`); err != nil {
		t.Fatal(err)
	}
	fresh, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := idem.NewProcessor(fresh, &idem.Config[pgx.Tx]{
		Consumer: "billing", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if r, err := p.ProcessTx(ctx, tx, idem.Message{ID: "m1"}); err != nil || r.Outcome != idem.Applied {
		t.Fatalf("ProcessTx = %+v, %v", r, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
