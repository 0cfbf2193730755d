package mysqlinbox_test

import (
	"context"
	"strings"
	"testing"
)

// MariaDB's defaults keep every acknowledged commit on a server without
// replicas; a server that flushes InnoDB's log once a second is reported.
// The second case changes a server-wide setting for a moment (restored at
// the end): it slows no one's test and loses nothing on a running server.
func TestDurability(t *testing.T) {
	ctx := context.Background()
	db := freshDB(t)
	for _, d := range dialects(t) {
		t.Run(d.Name(), func(t *testing.T) {
			s := migratedAs(t, db, d, nil)
			dur, err := s.Durability(ctx)
			if err != nil {
				t.Fatal(err)
			}
			flush := dur.Settings["innodb_flush_log_at_trx_commit"]
			if flush != "1" || dur.Settings["replicas"] != "0" {
				t.Skipf("the test server is not on the defaults (%s)", dur.Summary())
			}
			if len(dur.Risks) != 0 {
				t.Fatalf("risks on the defaults: %v (%s)", dur.Risks, dur.Summary())
			}
			if _, err := db.ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = 2"); err != nil {
				t.Skipf("cannot change innodb_flush_log_at_trx_commit: %v", err)
			}
			t.Cleanup(func() { _, _ = db.ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = "+flush) })
			dur, err = s.Durability(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(dur.Risks) != 1 || !strings.Contains(dur.Risks[0].What, "innodb_flush_log_at_trx_commit is 2") {
				t.Fatalf("risks with the log flushed once a second: %v (%s)", dur.Risks, dur.Summary())
			}
			if _, err := db.ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = "+flush); err != nil {
				t.Fatal(err)
			}
		})
	}
}
