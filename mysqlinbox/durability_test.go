package mysqlinbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/sqlinbox"
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
			// MariaDB's 3 flushes at every commit too (MySQL has no 3).
			if d == sqlinbox.MariaDB {
				if _, err := db.ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = 3"); err != nil {
					t.Fatal(err)
				}
				if dur, err = s.Durability(ctx); err != nil || len(dur.Risks) != 0 {
					t.Fatalf("risks with innodb_flush_log_at_trx_commit = 3 on MariaDB: %v %v (%s)", dur.Risks, err, dur.Summary())
				}
			}
			if _, err := db.ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = "+flush); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDurabilitySemiSync: semi-synchronous replication enabled with
// MariaDB's defaults (wait point AFTER_COMMIT, a 10 s timeout) is reported
// twice; with AFTER_SYNC and an hour's timeout it is not, until it stops
// waiting for absent replicas (wait_no_slave OFF). The server's settings
// change for a moment and are restored; on a server without a binary log
// (the test server's) semi-synchronous replication holds no commit.
func TestDurabilitySemiSync(t *testing.T) {
	ctx := context.Background()
	db := freshDB(t)
	s := migrated(t, db, nil)
	var logBin bool
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.log_bin").Scan(&logBin); err != nil {
		t.Fatal(err)
	}
	if logBin {
		t.Skip("the test server writes a binary log: enabling semi-synchronous replication would hold its commits")
	}
	names := []string{"enabled", "wait_point", "timeout", "wait_no_slave"}
	saved := map[string]string{}
	for _, n := range names {
		var v string
		if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.rpl_semi_sync_master_"+n).Scan(&v); err != nil {
			t.Skipf("no rpl_semi_sync_master_%s on this server: %v", n, err)
		}
		saved[n] = v
	}
	if saved["enabled"] != "0" {
		t.Skipf("semi-synchronous replication is enabled on the test server already")
	}
	set := func(n, v string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, "SET GLOBAL rpl_semi_sync_master_"+n+" = "+v); err != nil {
			t.Fatalf("SET GLOBAL rpl_semi_sync_master_%s = %s: %v", n, v, err)
		}
	}
	t.Cleanup(func() {
		for _, n := range names {
			v := saved[n]
			if n == "wait_point" {
				v = "'" + v + "'"
			}
			_, _ = db.ExecContext(context.Background(), "SET GLOBAL rpl_semi_sync_master_"+n+" = "+v)
		}
	})
	check := func(want ...string) {
		t.Helper()
		dur, err := s.Durability(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(dur.Risks) != len(want) {
			t.Fatalf("risks %v, want %d (%s)", dur.Risks, len(want), dur.Summary())
		}
		for i, w := range want {
			if !strings.Contains(dur.Risks[i].What, w) {
				t.Errorf("risk %d = %v, want one saying %q (%s)", i, dur.Risks[i], w, dur.Summary())
			}
		}
	}
	set("wait_point", "'AFTER_COMMIT'")
	set("timeout", "10000")
	set("wait_no_slave", "ON")
	set("enabled", "ON")
	check("waits AFTER_COMMIT", "within 10000 ms")
	set("wait_point", "'AFTER_SYNC'")
	set("timeout", "3600000")
	check()
	set("wait_no_slave", "OFF")
	check("does not wait when no replica is connected")
}

// TestDurabilityWithoutProcess: a user without the PROCESS privilege sees
// no other session's threads, so the replicas cannot be counted: they read
// as unknown, not as none.
func TestDurabilityWithoutProcess(t *testing.T) {
	ctx := context.Background()
	cfg := mysqltest.Database(t, "idem_t_")
	root, err := mysqlinbox.Open(cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close() })
	migrated(t, root, nil)
	user := cfg.DBName
	for _, q := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw'",
		"GRANT ALL ON " + cfg.DBName + ".* TO '" + user + "'@'%'",
	} {
		if _, err := root.ExecContext(ctx, q); err != nil {
			t.Skipf("cannot create a user without PROCESS (%s): %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = root.ExecContext(ctx, "DROP USER '"+user+"'@'%'") })
	for _, c := range []struct {
		who  string
		db   *sql.DB
		want string
	}{
		{"the server's administrator", root, "0"},
		{"a user without PROCESS", nil, "unknown (no PROCESS privilege)"},
	} {
		if c.db == nil {
			u := cfg.Clone()
			u.User, u.Passwd = user, "pw"
			if c.db, err = mysqlinbox.Open(u.FormatDSN()); err != nil {
				t.Fatal(err)
			}
			defer c.db.Close()
		}
		s, err := mysqlinbox.New(c.db, nil)
		if err != nil {
			t.Fatal(err)
		}
		dur, err := s.Durability(ctx)
		if err != nil {
			t.Fatalf("%s: %v", c.who, err)
		}
		if got := dur.Settings["replicas"]; got != c.want {
			if c.want == "0" {
				t.Skipf("the test server has replicas, or its administrator lacks PROCESS: replicas %s", got)
			}
			t.Errorf("%s: replicas %q, want %q (%s)", c.who, got, c.want, dur.Summary())
		}
	}
}
