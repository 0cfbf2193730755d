package mysqlinbox_test

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

// On MySQL and MariaDB, a paused consumer holds its messages, writing
// nothing, until it is resumed; the pause says who and why, and the audit
// table keeps both actions.
func TestPauseResumeOnMySQL(t *testing.T) {
	for _, d := range dialects(t) {
		t.Run(d.Name(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			db := freshDB(t)
			store := migratedAs(t, db, d, nil)
			proc, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
				Consumer: "billing", Key: idem.ByMessageID, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Handler: func(context.Context, *sql.Tx, idem.Message) error { return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			if p, already, err := store.Pause(ctx, "billing", "alice", "incident 42"); err != nil || already || !p.Paused || p.By != "alice" || p.Since.IsZero() {
				t.Fatalf("Pause = %+v, %v, %v", p, already, err)
			}
			if _, already, err := store.Pause(ctx, "billing", "bob", "again"); err != nil || !already {
				t.Fatalf("pausing twice: already=%v, %v", already, err)
			}
			ps, err := store.Pauses(ctx)
			if err != nil || len(ps) != 1 || ps[0].Consumer != "billing" || ps[0].Why != "incident 42" {
				t.Fatalf("Pauses = %+v, %v", ps, err)
			}
			for _, r := range proc.ProcessBatch(ctx, []idem.Message{{ID: "m1"}, {ID: "m2"}}) {
				if !errors.Is(r.Err, idem.ErrPaused) || proc.Dispose(r).Action != idem.ActionHold || r.Attempts != 0 {
					t.Fatalf("a paused consumer's result = %+v", r)
				}
			}
			var n int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_inbox`).Scan(&n); err != nil || n != 0 {
				t.Fatalf("a paused consumer wrote %d markers (%v)", n, err)
			}
			if _, err := store.Resume(ctx, "billing", "bob", "fixed"); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Resume(ctx, "billing", "bob", "twice"); !errors.Is(err, sqlinbox.ErrNotPaused) {
				t.Fatalf("resuming twice: %v", err)
			}
			deadline := time.Now().Add(time.Minute)
			for proc.Process(ctx, idem.Message{ID: "m1"}).Outcome != idem.Applied {
				if time.Now().After(deadline) {
					t.Fatal("still held a minute after the resume")
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_consumer_pause_log`).Scan(&n); err != nil || n != 2 {
				t.Fatalf("audit rows = %d (%v), want a pause and a resume", n, err)
			}
		})
	}
}
