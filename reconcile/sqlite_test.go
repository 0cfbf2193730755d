package reconcile_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/reconcile"
	"github.com/idemkit/idem/sqliteinbox"
)

// TestReconcileSQLiteOutbox: the outbox source reads an outbox on SQLite
// like one on PostgreSQL, its event-time range included, and the judge is
// the consumer's processor over a database/sql store.
func TestReconcileSQLiteOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sqliteinbox.Open(filepath.Join(t.TempDir(), "reconcile.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqliteinbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.NewSQL(db, sqliteinbox.Dialect, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	proc, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{
		Consumer: "billing", Key: idem.ByMessageID, Logger: quiet,
		Handler: func(context.Context, *sql.Tx, idem.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := ob.Enqueue(ctx, tx, outbox.Message{Destination: "orders", Body: []byte("1")}, outbox.Message{Destination: "orders", Body: []byte("2")},
		outbox.Message{Destination: "orders", Body: []byte("3")}, outbox.Message{Destination: "refunds", Body: []byte("4")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// Sent: all but the third, which the relay has not published yet.
	if _, err := db.ExecContext(ctx, `UPDATE idem_outbox SET sent_at = '2026-01-01T00:00:00.000000Z' WHERE id <> ?`, ids[2]); err != nil {
		t.Fatal(err)
	}
	if r := proc.Process(ctx, idem.Message{ID: ids[0], Time: time.Now(), TimeSource: idem.TimeFromHeader}); r.Outcome != idem.Applied {
		t.Fatalf("applying: %s %v", r.Outcome, r.Err)
	}
	src := &reconcile.Outbox{Rows: ob, Destination: "orders"}
	rep, err := reconcile.Check(ctx, src, proc, reconcile.Range{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got := missingIDs(&rep); rep.Checked != 2 || !slices.Equal(got, []string{ids[1]}) {
		t.Fatalf("checked %d, missing %v: want 2 checked, %s missing", rep.Checked, got, ids[1])
	}
	// A range before the rows holds none of them.
	if rep, err := reconcile.Check(ctx, src, proc, reconcile.Range{To: time.Now().Add(-time.Hour)}); err != nil || rep.Checked != 0 {
		t.Fatalf("an earlier range: checked %d, %v", rep.Checked, err)
	}
}
