package sqlinbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/sqlinbox"
)

// On the test servers' defaults no acknowledged commit can be lost (one
// PostgreSQL without standbys; SQLite as sqliteinbox.Open sets it up).
func TestDurabilityOnDefaults(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			s := migrated(t, b.open(t), b.dialect, nil)
			d, err := s.Durability(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if d.Settings["streaming_standbys"] != "" && d.Settings["streaming_standbys"] != "0" {
				t.Skipf("the test server has standbys (%s)", d.Summary())
			}
			if len(d.Risks) != 0 || len(d.Settings) == 0 {
				t.Fatalf("risks %v, settings %v", d.Risks, d.Settings)
			}
		})
	}
}

// A SQLite database opened without waiting for the disk is reported.
func TestDurabilitySQLiteSynchronousOff(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "inbox.db")+"?_pragma=journal_mode(WAL)&_pragma=synchronous(OFF)&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s := migrated(t, db, sqlinbox.SQLite, nil)
	d, err := s.Durability(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Risks) != 1 || !strings.Contains(d.Risks[0].What, "synchronous is OFF") || d.Settings["journal_mode"] != "wal" {
		t.Fatalf("risks %v (%s)", d.Risks, d.Summary())
	}
}
