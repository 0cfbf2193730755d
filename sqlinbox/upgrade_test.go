package sqlinbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/sqlinbox"
)

// TestUpgradeSQLite: a SQLite inbox of the previous release is rebuilt
// with keep_until (SQLite adds a NOT NULL column only with a constant
// default), backfilled as the later of each marker's write and event
// times, with its indexes; its markers stay duplicates, the stored window is
// written, and the prune keeps what it kept before.
func TestUpgradeSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openSQLite(t)
	for _, q := range []string{
		`CREATE TABLE "idem_inbox" (
    consumer     TEXT NOT NULL,
    key          TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    body_sha256  BLOB NOT NULL,
    event_time   TEXT,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')),
    PRIMARY KEY (consumer, key)
) WITHOUT ROWID`,
		`CREATE INDEX "idem_inbox_processed_at_idx" ON "idem_inbox" (processed_at)`,
		`CREATE TABLE "idem_migrations" (table_name text PRIMARY KEY, version integer NOT NULL, applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f000Z', 'now')))`,
		`INSERT INTO idem_migrations (table_name, version) VALUES ('"idem_inbox"', 1)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	f := func(t time.Time) string { return t.UTC().Format(sqliteTimeFormat) }
	now := time.Now()
	old, young := f(now.Add(-15*24*time.Hour)), f(now.Add(-13*24*time.Hour))
	if _, err := db.ExecContext(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at) VALUES
('ledger', 'evt-old', 'evt-old', x'00', ?1, ?1), ('ledger', 'evt-event-young', 'evt-event-young', x'00', ?2, ?1), ('ledger', 'evt-untimed', 'evt-untimed', x'00', NULL, ?2)`, old, young); err != nil {
		t.Fatal(err)
	}
	s := migrated(t, db, sqlinbox.SQLite, nil)
	for key, want := range map[string]string{"evt-old": old, "evt-event-young": young, "evt-untimed": young} {
		var got string
		if err := db.QueryRowContext(ctx, `SELECT keep_until FROM idem_inbox WHERE key = ?1`, key).Scan(&got); err != nil || got != want {
			t.Errorf("%s: keep_until %q (%v), want %q", key, got, err, want)
		}
	}
	var idx int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'idem_inbox' AND sql LIKE '%(keep_until)'`).Scan(&idx); err != nil || idx != 1 {
		t.Fatalf("%d indexes on keep_until (%v), want 1", idx, err)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'idem_inbox' AND sql LIKE '%(processed_at)'`).Scan(&idx); err != nil || idx != 0 {
		t.Fatalf("%d indexes on processed_at after the upgrade (%v), want none: the prune goes by keep_until", idx, err)
	}
	if n := countRows(t, db, "idem_inbox"); n != 3 {
		t.Fatalf("%d markers after the rebuild, want 3", n)
	}
	if set, err := s.Settings(ctx); err != nil || set.Window != retention.DefaultWindow {
		t.Fatalf("settings after the upgrade: %+v %v", set, err)
	}
	if inserted := claimCommit(t, s, "ledger", claims("evt-event-young", "evt-new")); inserted[0] || !inserted[1] {
		t.Fatalf("claims after the upgrade: %v, want the old key a duplicate and the new one inserted", inserted)
	}
	res, err := s.Prune(ctx, retention.Options{})
	if err != nil || res.Markers != 1 {
		t.Fatalf("prune after the upgrade: %+v %v, want the one old marker", res, err)
	}
}
