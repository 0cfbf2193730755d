package sqlinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// sqliteCatalog is every object of the database with its SQL, and the
// bookkeeping rows.
func sqliteCatalog(t *testing.T, db *sql.DB) string {
	t.Helper()
	var lines []string
	rows, err := db.Query(`SELECT 'object ' || type || ' ' || name || ' ' || coalesce(sql, '') FROM sqlite_master
UNION ALL SELECT 'settings ' || table_name || ' ' || layout || ' ' || window_ms FROM idem_inbox_settings
UNION ALL SELECT 'version ' || table_name || ' ' || version FROM idem_migrations
ORDER BY 1`)
	if err != nil {
		t.Fatalf("reading the catalog: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

func sqliteDDL(t *testing.T) string {
	t.Helper()
	ddl, err := sqlinbox.DDL(sqlinbox.SQLite, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	return ddl
}

// TestSQLiteDDLSameAsMigrate: the DDL applied with one Exec makes the same
// objects and bookkeeping as Migrate; the table passes Check, takes claims,
// and a later Migrate finds it up to date.
func TestSQLiteDDLSameAsMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	viaDDL, viaMigrate := openSQLite(t), openSQLite(t)
	if _, err := viaDDL.ExecContext(ctx, sqliteDDL(t)); err != nil {
		t.Fatalf("applying the DDL: %v", err)
	}
	migrated(t, viaMigrate, sqlinbox.SQLite, nil)
	got, want := sqliteCatalog(t, viaDDL), sqliteCatalog(t, viaMigrate)
	if got != want {
		t.Fatalf("the DDL's catalog differs from Migrate's:\n--- DDL\n%s\n--- Migrate\n%s", got, want)
	}
	if !strings.Contains(got, "idem_inbox_keep_until_idx") {
		t.Fatalf("no keep_until index:\n%s", got)
	}

	store, err := sqlinbox.New(viaDDL, sqlinbox.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if probs, err := store.Check(ctx); err != nil || len(probs) != 0 {
		t.Fatalf("Check on the DDL's table: %v %v, want no problems", probs, err)
	}
	proc := sqlProcessor(t, store)
	if err := proc.Check(ctx); err != nil {
		t.Fatalf("Processor.Check: %v", err)
	}
	msg := idem.Message{ID: idem.NewUUIDv7(time.Now()), Body: []byte("x")}
	if r := proc.Process(ctx, msg); r.Outcome != idem.Applied {
		t.Fatalf("first delivery: %v %v", r.Outcome, r.Err)
	}
	if r := proc.Process(ctx, msg); r.Outcome != idem.Duplicate {
		t.Fatalf("second delivery: %v %v", r.Outcome, r.Err)
	}
	rep, err := store.MigrateReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Created || rep.From != rep.To || rep.String() != fmt.Sprintf("idem_inbox is up to date (schema version %d)", rep.To) {
		t.Fatalf("Migrate after the DDL: %q %+v, want up to date", rep, rep)
	}

	// Down removes the inbox and its rows; up runs again after it.
	down, err := sqlinbox.DownDDL(sqlinbox.SQLite, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := viaDDL.ExecContext(ctx, down); err != nil {
		t.Fatalf("down: %v", err)
	}
	if n := countRows(t, viaDDL, "sqlite_master WHERE tbl_name = 'idem_inbox'"); n != 0 {
		t.Fatalf("down left %d inbox objects", n)
	}
	if n := countRows(t, viaDDL, "idem_migrations") + countRows(t, viaDDL, "idem_inbox_settings"); n != 0 {
		t.Fatalf("down left %d bookkeeping rows", n)
	}
	if _, err := viaDDL.ExecContext(ctx, sqliteDDL(t)); err != nil {
		t.Fatalf("up after down: %v", err)
	}
}

// TestPostgresDDLIsPgxinboxPlain: on PostgreSQL both stores share one
// table, hence one DDL.
func TestPostgresDDLIsPgxinboxPlain(t *testing.T) {
	t.Parallel()
	a, err := sqlinbox.DDL(sqlinbox.Postgres, "billing.inbox", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pgxinbox.DDL("billing.inbox", pgxinbox.Plain, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if a != b || !strings.Contains(a, `"billing"."inbox"`) {
		t.Fatalf("sqlinbox's PostgreSQL DDL differs from pgxinbox's plain one:\n%s\n---\n%s", a, b)
	}
	if _, err := sqlinbox.DDL(sqlinbox.SQLite, "billing.inbox", 0); err == nil || !errors.Is(err, idem.ErrConfig) {
		t.Fatalf("SQLite DDL of a qualified name: %v, want a configuration error", err)
	}
}

func sqlProcessor(t *testing.T, s *sqlinbox.Store) *idem.Processor[*sql.Tx] {
	t.Helper()
	p, err := idem.NewProcessor(s, &idem.Config[*sql.Tx]{
		Consumer: "billing",
		Key:      idem.ByMessageID,
		Handler:  func(context.Context, *sql.Tx, idem.Message) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSQLiteCheckFindsBrokenTables: each way a SQLite inbox breaks is a
// problem with its fix, naming the database file, and a consumer refuses
// to start on it (or, for a missing keep_until index, which claims do not
// need, starts and logs it).
func TestSQLiteCheckFindsBrokenTables(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, breakf, what, fix string
		advisory                bool
	}{
		{"missing table", `DROP TABLE idem_inbox`, "table idem_inbox does not exist", "idem inbox migrate --sqlite ", false},
		{"dropped keep_until index", `DROP INDEX idem_inbox_keep_until_idx`, "no index on keep_until",
			`CREATE INDEX IF NOT EXISTS "idem_inbox_keep_until_idx" ON "idem_inbox" (keep_until)`, true},
		{"missing settings row", `DELETE FROM idem_inbox_settings`, "no stored layout and retention window", "idem inbox migrate --sqlite ", false},
		{"table of another shape", `DROP TABLE idem_inbox; CREATE TABLE idem_inbox (id INTEGER PRIMARY KEY, consumer TEXT, key TEXT, payload TEXT)`,
			"no column message_id, body_sha256, event_time, processed_at, keep_until", "rename it aside", false},
		{"no unique key", `DROP TABLE idem_inbox; CREATE TABLE idem_inbox (consumer TEXT NOT NULL, key TEXT NOT NULL, message_id TEXT NOT NULL,
			body_sha256 BLOB NOT NULL, event_time TEXT, processed_at TEXT NOT NULL, keep_until TEXT NOT NULL);
			CREATE INDEX idem_inbox_keep_until_idx ON idem_inbox (keep_until)`,
			"no unique key on (consumer, key)", "ADD PRIMARY KEY", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			file := filepath.Join(t.TempDir(), "inbox.db")
			db, err := sqliteinbox.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			store := migrated(t, db, sqlinbox.SQLite, nil)
			if probs, err := store.Check(ctx); err != nil || len(probs) != 0 {
				t.Fatalf("freshly migrated: %v %v", probs, err)
			}
			if _, err := db.ExecContext(ctx, c.breakf); err != nil {
				t.Fatal(err)
			}
			probs, err := store.Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, p := range probs {
				found = found || strings.Contains(p.What, c.what) && strings.Contains(p.Fix, c.fix)
				if strings.Contains(p.Fix, "idem inbox") && !strings.Contains(p.Fix, file) {
					t.Errorf("fix %q does not name the database file %s", p.Fix, file)
				}
			}
			if !found {
				t.Fatalf("problems %v, want one saying %q with the fix %q", probs, c.what, c.fix)
			}
			err = sqlProcessor(t, store).Check(ctx)
			if c.advisory {
				if err != nil {
					t.Fatalf("Processor.Check = %v, want a start: %q is advisory", err, c.what)
				}
				return
			}
			var se *idem.SchemaError
			if !errors.Is(err, idem.ErrInboxNotReady) || !errors.As(err, &se) || !strings.Contains(err.Error(), c.what) {
				t.Fatalf("Processor.Check = %v, want ErrInboxNotReady with a SchemaError saying %q", err, c.what)
			}
		})
	}
}

// TestCheckOnBothDialects: on database/sql, PostgreSQL and SQLite alike, a
// migrated table is clean and a dropped keep_until index is found.
func TestCheckOnBothDialects(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := b.open(t)
			store := migrated(t, db, b.dialect, nil)
			if probs, err := store.Check(ctx); err != nil || len(probs) != 0 {
				t.Fatalf("migrated table: %v %v, want no problems", probs, err)
			}
			if _, err := db.ExecContext(ctx, `DROP INDEX idem_inbox_keep_until_idx`); err != nil {
				t.Fatal(err)
			}
			probs, err := store.Check(ctx)
			if err != nil || len(probs) != 1 || !strings.Contains(probs[0].What, "no index on keep_until") ||
				!strings.Contains(probs[0].Fix, "CREATE INDEX") {
				t.Fatalf("after dropping the keep_until index: %v %v, want that one problem with its fix", probs, err)
			}
		})
	}
}

// TestSQLiteNewerSchemaIsAdvisory: a SQLite table of a newer build is
// reported as advisory, and a consumer of this build starts on it.
func TestSQLiteNewerSchemaIsAdvisory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openSQLite(t)
	store := migrated(t, db, sqlinbox.SQLite, nil)
	if _, err := db.ExecContext(ctx, `UPDATE idem_migrations SET version = version + 1`); err != nil {
		t.Fatal(err)
	}
	probs, err := store.Check(ctx)
	if err != nil || len(probs) != 1 || !probs[0].Advisory || !strings.Contains(probs[0].What, "newer than this build of idem knows") {
		t.Fatalf("problems %+v %v, want one advisory problem", probs, err)
	}
	if err := sqlProcessor(t, store).Check(ctx); err != nil {
		t.Fatalf("Processor.Check on a newer schema: %v, want a start", err)
	}
}
