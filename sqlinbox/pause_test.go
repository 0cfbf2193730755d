package sqlinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlinbox"
)

// On every database of package sqlinbox, a paused consumer holds its
// messages, writing nothing, until it is resumed; the pause says who and
// why, and the audit table keeps both actions. The pause is read in a
// caller's transaction without disturbing it.
func TestPauseResumeHoldsAndWritesNothing(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db := b.open(t)
			testPauseResume(t, db, migrated(t, db, b.dialect, nil))
		})
	}
}

func testPauseResume(t *testing.T, db *sql.DB, store *sqlinbox.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var ran atomic.Int64
	proc, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
		Consumer: "billing", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(context.Context, *sql.Tx, idem.Message) error { ran.Add(1); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := store.Paused(ctx, "billing"); err != nil || p.Paused {
		t.Fatalf("before any pause: %+v, %v", p, err)
	}
	if p, already, err := store.Pause(ctx, "billing", "alice", "incident 42"); err != nil || already || !p.Paused || p.By != "alice" || p.Since.IsZero() {
		t.Fatalf("Pause = %+v, %v, %v", p, already, err)
	}
	ps, err := store.Pauses(ctx)
	if err != nil || len(ps) != 1 || ps[0].Consumer != "billing" || ps[0].Why != "incident 42" {
		t.Fatalf("Pauses = %+v, %v", ps, err)
	}
	msgs := []idem.Message{{ID: "m1"}, {ID: "m2"}}
	for _, r := range proc.ProcessBatch(ctx, msgs) {
		if !errors.Is(r.Err, idem.ErrPaused) || proc.Dispose(r).Action != idem.ActionHold || r.Attempts != 0 {
			t.Fatalf("a paused consumer's result = %+v", r)
		}
	}
	if n := countRows(t, db, "idem_inbox"); n != 0 || ran.Load() != 0 {
		t.Fatalf("a paused consumer wrote %d markers and ran its handler %d times", n, ran.Load())
	}
	if _, err := store.Resume(ctx, "billing", "bob", "fixed"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Resume(ctx, "billing", "bob", "twice"); !errors.Is(err, sqlinbox.ErrNotPaused) {
		t.Fatalf("resuming twice: %v", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := proc.ProcessTx(ctx, tx, msgs[0])
		if err == nil {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if r.Outcome != idem.Applied {
				t.Fatalf("after the resume: %+v", r)
			}
			break
		}
		_ = tx.Rollback()
		if !errors.Is(err, idem.ErrPaused) || time.Now().After(deadline) {
			t.Fatalf("after the resume: %+v, %v", r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := countRows(t, db, "idem_consumer_pause_log"); n != 2 {
		t.Fatalf("audit rows = %d, want a pause and a resume", n)
	}
}
