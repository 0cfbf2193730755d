package inboxdb

import (
	"strings"
	"testing"

	"github.com/idemkit/idem/idemstore"
)

// TestIndexName: every derived index name fits PostgreSQL's 63 bytes (a
// longer one is cut silently, for a 63-byte table name to the table's own
// name), keeps its column suffix, and differs for two long table names that
// share a prefix; short names keep the form older releases created.
func TestIndexName(t *testing.T) {
	if got := (Table{Name: "idem_inbox"}).IndexName("processed_at"); got != "idem_inbox_processed_at_idx" {
		t.Fatalf("short name: %q", got)
	}
	a, b := Table{Name: strings.Repeat("x", 63)}, Table{Name: strings.Repeat("x", 62) + "y"}
	seen := map[string]bool{}
	for _, tb := range []Table{a, b} {
		for _, col := range []string{"processed_at", "keep_until"} {
			n := tb.IndexName(col)
			if len(n) > 63 || !strings.HasSuffix(n, "_"+col+"_idx") || n == tb.Name || seen[n] {
				t.Fatalf("index name %q (%d bytes) for table %q, column %s: want at most 63 bytes, the suffix, and distinct", n, len(n), tb.Name, col)
			}
			seen[n] = true
		}
	}
}

// TestMigrationsRender: every dialect's and layout's migrations render,
// number 1, 2, … without gaps, and split into statements.
func TestMigrationsRender(t *testing.T) {
	for _, d := range []*Dialect{
		Postgres(Table{Schema: "billing", Name: "inbox"}, idemstore.LayoutPlain),
		Postgres(Table{Name: "inbox"}, idemstore.LayoutPartitioned),
		SQLite(Table{Name: "inbox"}),
	} {
		ms, err := d.migrationList()
		if err != nil {
			t.Fatalf("%s %s: %v", d.Name, d.Layout, err)
		}
		if len(ms) != 2 {
			t.Fatalf("%s %s: %d migrations, want 2", d.Name, d.Layout, len(ms))
		}
		for _, m := range ms {
			for _, s := range m.Statements {
				if strings.HasSuffix(s, ";") || strings.TrimSpace(s) == "" {
					t.Fatalf("%s: statement %q not split cleanly", m.Name, s)
				}
			}
		}
	}
}
