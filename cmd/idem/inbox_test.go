package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// inboxRun runs `idem inbox args...` and returns stdout, failing the test
// on an exit status other than want.
func inboxRun(t *testing.T, want int, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), append([]string{"inbox"}, args...), &out, &errb); code != want {
		t.Fatalf("idem inbox %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out.String(), errb.String())
	}
	return out.String()
}

// seedInbox migrates an inbox of the layout on a fresh schema and writes
// three markers past the 14-day window and one inside it.
func seedInbox(t *testing.T, layout pgxinbox.Layout) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if layout == pgxinbox.Partitioned {
		if _, err := store.EnsurePartitions(ctx, time.Now().AddDate(0, 0, -20), 21); err != nil {
			t.Fatal(err)
		}
	}
	partCol, partVal := "", ""
	if layout == pgxinbox.Partitioned {
		partCol, partVal = ", partition_time", ", t"
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until`+partCol+`)
SELECT 'ledger', k, k, '\x00', t, t, t`+partVal+` FROM (VALUES
  ('old-1', now() - interval '20 days'), ('old-2', now() - interval '19 days'),
  ('old-3', now() - interval '18 days'), ('young', now() - interval '1 day')) v(k, t)`); err != nil {
		t.Fatal(err)
	}
	return url, pool
}

func rows(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_inbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestInboxPrunePlain(t *testing.T) {
	t.Parallel()
	url, pool := seedInbox(t, pgxinbox.Plain)
	var st struct {
		Rows            int64    `json:"rows"`
		Layout          string   `json:"layout"`
		Prunable        int64    `json:"prunable"`
		HeadroomSeconds float64  `json:"headroom_seconds"`
		Oldest          *string  `json:"oldest"`
		Partitions      []string `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(inboxRun(t, 0, "stats", "--database", url, "--json")), &st); err != nil {
		t.Fatal(err)
	}
	// The oldest marker is 20 days old: six days past a 14-day window.
	if st.Rows != 4 || st.Layout != "plain" || st.Prunable != 3 || st.Oldest == nil ||
		st.HeadroomSeconds > -6*86400+60 || st.HeadroomSeconds < -6*86400-60 {
		t.Fatalf("stats: %+v", st)
	}
	out := inboxRun(t, 0, "prune", "--database", url, "--dry-run")
	if !strings.Contains(out, "would delete 3 markers") || rows(t, pool) != 4 {
		t.Fatalf("dry run said %q and left %d rows", out, rows(t, pool))
	}
	out = inboxRun(t, 0, "prune", "--database", url, "--batch", "2")
	if !strings.Contains(out, "deleted 3 markers") || !strings.Contains(out, "in 2 transactions") || rows(t, pool) != 1 {
		t.Fatalf("prune said %q and left %d rows", out, rows(t, pool))
	}
	// A longer window keeps everything.
	if out := inboxRun(t, 0, "prune", "--database", url, "--window", "720h"); !strings.Contains(out, "nothing to delete") {
		t.Fatalf("prune with a 30-day window: %q", out)
	}
	inboxRun(t, 3, "partitions", "drop", "--database", url)
	inboxRun(t, 3, "prune", "--database", url, "--table", "missing")
	inboxRun(t, 2, "prune", "--database", url, "--window", "-1h")
	inboxRun(t, 2, "bogus")
}

func TestInboxPartitions(t *testing.T) {
	t.Parallel()
	url, pool := seedInbox(t, pgxinbox.Partitioned)
	var ensured struct{ Created []string }
	from := time.Now().UTC().Format(time.DateOnly)
	if err := json.Unmarshal([]byte(inboxRun(t, 0, "partitions", "ensure", "--database", url, "--from", from, "--days", "10", "--json")), &ensured); err != nil {
		t.Fatal(err)
	}
	// Migrate made today and three days ahead; ten days need six more.
	if len(ensured.Created) != 6 {
		t.Fatalf("ensure created %v, want 6", ensured.Created)
	}
	out := inboxRun(t, 0, "partitions", "drop", "--database", url, "--dry-run")
	if !strings.Contains(out, "would drop") || rows(t, pool) != 4 {
		t.Fatalf("dry run said %q and left %d rows", out, rows(t, pool))
	}
	// The partitions of days 20 … 15 ago go (six), with the three old
	// markers; the young one stays.
	out = inboxRun(t, 0, "prune", "--database", url)
	if !strings.Contains(out, "dropped 6 partitions") || rows(t, pool) != 1 {
		t.Fatalf("prune said %q and left %d rows", out, rows(t, pool))
	}
	if out := inboxRun(t, 0, "stats", "--database", url); !strings.Contains(out, "(partitioned)") || !strings.Contains(out, "rows       1") {
		t.Fatalf("stats: %s", out)
	}
}

func TestInboxPruneSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "inbox.db")
	db, err := sqliteinbox.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := sqlinbox.New(db, sqlinbox.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	f := "2006-01-02T15:04:05.000000Z"
	old, young := time.Now().UTC().AddDate(0, 0, -20).Format(f), time.Now().UTC().Format(f)
	if _, err := db.ExecContext(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256, event_time, processed_at, keep_until)
VALUES ('ledger', 'a', 'a', x'00', ?1, ?1, ?1), ('ledger', 'b', 'b', x'00', NULL, ?1, ?1), ('ledger', 'c', 'c', x'00', ?2, ?2, ?2)`, old, young); err != nil {
		t.Fatal(err)
	}
	if out := inboxRun(t, 0, "stats", "--sqlite", path); !strings.Contains(out, "prunable   2") {
		t.Fatalf("stats: %s", out)
	}
	if out := inboxRun(t, 0, "prune", "--sqlite", path); !strings.Contains(out, "deleted 2 markers") {
		t.Fatalf("prune: %s", out)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_inbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after prune: %d %v", n, err)
	}
	inboxRun(t, 3, "prune", "--sqlite", filepath.Join(t.TempDir(), "missing.db"))
}

// inboxRunErr runs `idem inbox args...` and returns stdout and stderr,
// failing the test on an exit status other than want.
func inboxRunErr(t *testing.T, want int, args ...string) (string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), append([]string{"inbox"}, args...), &out, &errb); code != want {
		t.Fatalf("idem inbox %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

// TestInboxPruneShorterWindowRefused pins issue 11's third situation: a
// prune asked for a window shorter than the one stored with the table is
// refused with both numbers and deletes nothing. Before, the store took the
// flag's window as its own, and --window 1s deleted every marker.
func TestInboxPruneShorterWindowRefused(t *testing.T) {
	t.Parallel()
	for _, layout := range []pgxinbox.Layout{pgxinbox.Plain, pgxinbox.Partitioned} {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			url, pool := seedInbox(t, layout)
			for _, args := range [][]string{
				{"prune", "--database", url, "--window", "1s"},
				{"prune", "--database", url, "--window", "1s", "--dry-run"},
				{"prune", "--database", url, "--window", "335h"},
			} {
				_, stderr := inboxRunErr(t, 3, args...)
				if !strings.Contains(stderr, "shorter than the window stored with table idem_inbox, 336h0m0s") || !strings.Contains(stderr, "idem inbox window set") {
					t.Fatalf("%v: stderr %q, want both windows named and the command that changes the stored one", args, stderr)
				}
			}
			if layout == pgxinbox.Partitioned {
				if _, stderr := inboxRunErr(t, 3, "partitions", "drop", "--database", url, "--window", "1s"); !strings.Contains(stderr, "336h0m0s") {
					t.Fatalf("partitions drop --window 1s: %q", stderr)
				}
			}
			if n := rows(t, pool); n != 4 {
				t.Fatalf("%d markers left after refused prunes, want all 4", n)
			}
			// The stored window still prunes what is past it.
			inboxRun(t, 0, "prune", "--database", url)
			if n := rows(t, pool); n != 1 {
				t.Fatalf("%d markers left after the prune by the stored window, want 1", n)
			}
		})
	}
}

// TestInboxWindow: window show and set, on PostgreSQL and SQLite. Setting
// logs old and new; a window under an hour or below a consumer's recorded
// horizon is refused unless forced; prune and stats then use the new one.
func TestInboxWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := seedInbox(t, pgxinbox.Plain)
	path := filepath.Join(t.TempDir(), "inbox.db")
	db, err := sqliteinbox.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	lite, err := sqlinbox.New(db, sqlinbox.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := lite.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pg, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		target []string
		record func(consumer string, h time.Duration) error
	}{
		{"postgres", []string{"--database", url}, func(c string, h time.Duration) error { return pg.RecordHorizon(ctx, c, h) }},
		{"sqlite", []string{"--sqlite", path}, func(c string, h time.Duration) error { return lite.RecordHorizon(ctx, c, h) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := func(a ...string) []string { return append(a, tc.target...) }
			if out := inboxRun(t, 0, args("window", "show")...); !strings.Contains(out, "window   336h0m0s") || !strings.Contains(out, "(plain)") {
				t.Fatalf("window show: %q", out)
			}
			out, stderr := inboxRunErr(t, 0, args("window", "set", "720h")...)
			if !strings.Contains(out, "window 336h0m0s -> 720h0m0s") || !strings.Contains(stderr, "old=336h0m0s new=720h0m0s") {
				t.Fatalf("window set: stdout %q stderr %q, want old and new printed and logged", out, stderr)
			}
			if _, stderr := inboxRunErr(t, 3, args("window", "set", "30m")...); !strings.Contains(stderr, "under 1h0m0s") {
				t.Fatalf("window set 30m: %q, want it refused", stderr)
			}
			if err := tc.record("ledger", 500*time.Hour); err != nil {
				t.Fatal(err)
			}
			if _, stderr := inboxRunErr(t, 3, args("window", "set", "400h")...); !strings.Contains(stderr, "consumer ledger guards with a horizon of 500h0m0s") {
				t.Fatalf("window set below a horizon: %q, want it refused naming the consumer", stderr)
			}
			if out := inboxRun(t, 0, args("window", "show")...); !strings.Contains(out, "window   720h0m0s") || !strings.Contains(out, "horizon  ledger 500h0m0s") {
				t.Fatalf("window show after set: %q", out)
			}
			// The flag may come first; forced, it goes through, with a warning.
			out, stderr = inboxRunErr(t, 0, append([]string{"window", "set", "--force"}, append(tc.target, "400h")...)...)
			if !strings.Contains(out, "720h0m0s -> 400h0m0s") || !strings.Contains(stderr, "level=WARN") || !strings.Contains(stderr, "forced=true") {
				t.Fatalf("forced window set: stdout %q stderr %q", out, stderr)
			}
			var st struct {
				WindowSeconds float64 `json:"window_seconds"`
			}
			if err := json.Unmarshal([]byte(inboxRun(t, 0, args("stats", "--json")...)), &st); err != nil || st.WindowSeconds != 400*3600 {
				t.Fatalf("stats after set: %+v %v, want the new window", st, err)
			}
			inboxRun(t, 2, args("window", "set", "soon")...)
			inboxRun(t, 2, args("window", "set", "500h", "--window", "1h")...)
			inboxRun(t, 2, args("stats", "--window", "1h")...)
			inboxRun(t, 2, args("window", "set")...)
			inboxRun(t, 2, "window", "bogus")
		})
	}
}

// TestInboxMigrate: the command the consumers' refusal names creates the
// table with its settings, is idempotent, and refuses a window other than
// the stored one; a consumer then starts.
func TestInboxMigrate(t *testing.T) {
	url := pgtest.Schema(t)
	out := inboxRun(t, 0, "migrate", "--database", url, "--table", "billing_inbox", "--window", "720h")
	if !strings.Contains(out, "created billing_inbox (plain layout, window 30d, schema version 2)") {
		t.Fatalf("migrate said %q", out)
	}
	inboxRun(t, 0, "migrate", "--database", url, "--table", "billing_inbox")
	inboxRun(t, 3, "migrate", "--database", url, "--table", "billing_inbox", "--window", "24h")
	if out := inboxRun(t, 0, "window", "show", "--database", url, "--table", "billing_inbox"); !strings.Contains(out, "720h") {
		t.Fatalf("window show after migrate: %q", out)
	}
	file := filepath.Join(t.TempDir(), "app.db")
	if out := inboxRun(t, 0, "migrate", "--sqlite", file); !strings.Contains(out, "created idem_inbox (plain layout, window 14d, schema version 2)") {
		t.Fatalf("migrate --sqlite said %q", out)
	}
}

// TestInboxMigrateNotAnInbox: a table that lacks the columns every inbox
// version had is refused by migrate in one line, in the command's and the
// library's terms, and left alone; check gives the same advice. A table
// shaped like an older inbox, recorded nowhere, is what migrate is for.
func TestInboxMigrateNotAnInbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE r1_notinbox (a int, b text)`); err != nil {
		t.Fatal(err)
	}
	const what = "table r1_notinbox exists and is not an idem inbox (it has no column consumer, key, message_id, body_sha256, event_time, processed_at)"
	_, stderr := inboxRunErr(t, 3, "migrate", "--database", url, "--table", "r1_notinbox")
	if want := "idem inbox migrate: " + what + ": name another table with --table, or rename it aside\n"; stderr != want {
		t.Fatalf("migrate of a table that is no inbox: stderr %q, want %q", stderr, want)
	}
	var cols int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'r1_notinbox'`).Scan(&cols); err != nil || cols != 2 {
		t.Fatalf("the refused migrate left r1_notinbox with %d columns (%v), want its 2", cols, err)
	}
	out, _ := inboxRunErr(t, 1, "check", "--database", url, "--table", "r1_notinbox")
	if !strings.Contains(out, what) || !strings.Contains(out, "fix: name another table with --table, or rename it aside") || strings.Contains(out, "fix: idem inbox migrate") {
		t.Fatalf("check of a table that is no inbox:\n%s", out)
	}
	// The library says the same to its users, as a configuration error.
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Table: "r1_notinbox"})
	if err != nil {
		t.Fatal(err)
	}
	err = store.Migrate(ctx)
	if !errors.Is(err, idem.ErrConfig) || !strings.Contains(err.Error(), what+": name another table for the inbox, or rename this one aside") || strings.Contains(err.Error(), "SQLSTATE") {
		t.Fatalf("pgxinbox Migrate of a table that is no inbox: %v", err)
	}

	// An inbox of the first version, made by hand: no recorded version, no
	// settings. Its fix is migrate, and migrate upgrades it.
	if _, err := pool.Exec(ctx, `CREATE TABLE old_inbox (consumer text NOT NULL, key text NOT NULL, message_id text NOT NULL,
    body_sha256 bytea NOT NULL, event_time timestamptz, processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer, key))`); err != nil {
		t.Fatal(err)
	}
	if _, stderr := inboxRunErr(t, 3, "stats", "--database", url, "--table", "old_inbox"); !strings.Contains(stderr, "create it with: idem inbox migrate --table old_inbox") {
		t.Fatalf("stats of a hand-made first-version inbox: %q", stderr)
	}
	out, _ = inboxRunErr(t, 1, "check", "--database", url, "--table", "old_inbox")
	if !strings.Contains(out, "fix: idem inbox migrate --table old_inbox") || strings.Contains(out, "is not an idem inbox") {
		t.Fatalf("check of a hand-made first-version inbox:\n%s", out)
	}
	if out := inboxRun(t, 0, "migrate", "--database", url, "--table", "old_inbox"); !strings.Contains(out, "old_inbox") {
		t.Fatalf("migrate of a first-version inbox said %q", out)
	}
	inboxRun(t, 0, "stats", "--database", url, "--table", "old_inbox")
}

// TestInboxMigrateKeepsLayout: --layout is the layout of a new table. On
// every later deploy, migrate without it keeps the stored layout; with a
// different one, it says the table's and changes nothing.
func TestInboxMigrateKeepsLayout(t *testing.T) {
	t.Parallel()
	url := pgtest.Schema(t)
	if out := inboxRun(t, 0, "migrate", "--database", url, "--table", "t", "--layout", "partitioned"); !strings.Contains(out, "created t (partitioned layout") {
		t.Fatalf("first migrate said %q", out)
	}
	for _, args := range [][]string{{}, {"--layout", "partitioned"}} {
		args = append([]string{"migrate", "--database", url, "--table", "t"}, args...)
		if out := inboxRun(t, 0, args...); out != "t is up to date (schema version 2)\n" {
			t.Fatalf("idem inbox %s said %q", strings.Join(args, " "), out)
		}
	}
	_, stderr := inboxRunErr(t, 2, "migrate", "--database", url, "--table", "t", "--layout", "plain")
	if !strings.HasPrefix(stderr, "idem inbox migrate: table t has the partitioned layout; --layout plain applies only to a new table\n") {
		t.Fatalf("migrate --layout plain of a partitioned table: %q", stderr)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(inboxRun(t, 0, "migrate", "--database", url, "--table", "t", "--json")), &res); err != nil || res["layout"] != "partitioned" {
		t.Fatalf("migrate --json of the partitioned table: %v %v", res, err)
	}
	// The other way round, and the library's words for its users.
	inboxRun(t, 0, "migrate", "--database", url, "--table", "p")
	inboxRun(t, 0, "migrate", "--database", url, "--table", "p")
	if _, stderr := inboxRunErr(t, 2, "migrate", "--database", url, "--table", "p", "--layout", "partitioned"); !strings.Contains(stderr, "table p has the plain layout; --layout partitioned applies only to a new table") {
		t.Fatalf("migrate --layout partitioned of a plain table: %q", stderr)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgxinbox.New(pool, &pgxinbox.Config{Table: "t", Layout: pgxinbox.Plain})
	if err != nil {
		t.Fatal(err)
	}
	err = store.Migrate(context.Background())
	if !errors.Is(err, idem.ErrConfig) || !strings.Contains(err.Error(), "table t has the partitioned layout") ||
		strings.Contains(err.Error(), "relkind") || strings.Contains(err.Error(), "invalid idem configuration") {
		t.Fatalf("pgxinbox Migrate, plain, of a partitioned table: %v", err)
	}
}

// TestInboxMySQL runs the inbox subcommands on MariaDB with --mysql: a
// database of the test's own, migrated by the command, checked, three of
// four markers pruned, the window shown and set; the DDL for MySQL is the
// one migrate applies (check finds nothing to fix on a database it built).
func TestInboxMySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := mysqltest.Database(t, "idem_cli_")
	dsn := cfg.FormatDSN()
	out := inboxRun(t, 0, "migrate", "--mysql", dsn, "--window", "336h")
	if !strings.Contains(out, "created") {
		t.Fatalf("migrate: %s", out)
	}
	if out := inboxRun(t, 0, "migrate", "--mysql", dsn); !strings.Contains(out, "up to date") {
		t.Fatalf("migrate again: %s", out)
	}
	if out := inboxRun(t, 0, "check", "--mysql", dsn); !strings.Contains(out, "idem_inbox: OK") {
		t.Fatalf("check: %s", out)
	}
	db, err := mysqlinbox.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `INSERT INTO idem_inbox (consumer, "key", message_id, body_sha256, event_time, processed_at, keep_until) VALUES
('ledger', 'old-1', 'old-1', x'00', UTC_TIMESTAMP(6) - INTERVAL 20 DAY, UTC_TIMESTAMP(6) - INTERVAL 20 DAY, UTC_TIMESTAMP(6) - INTERVAL 20 DAY),
('ledger', 'old-2', 'old-2', x'00', NULL, UTC_TIMESTAMP(6) - INTERVAL 19 DAY, UTC_TIMESTAMP(6) - INTERVAL 19 DAY),
('ledger', 'old-3', 'old-3', x'00', NULL, UTC_TIMESTAMP(6) - INTERVAL 18 DAY, UTC_TIMESTAMP(6) - INTERVAL 18 DAY),
('ledger', 'young', 'young', x'00', NULL, UTC_TIMESTAMP(6) - INTERVAL 1 DAY, UTC_TIMESTAMP(6) - INTERVAL 1 DAY)`); err != nil {
		t.Fatal(err)
	}
	if out := inboxRun(t, 0, "stats", "--mysql", dsn); !strings.Contains(out, "rows       4") || !strings.Contains(out, "prunable   3") {
		t.Fatalf("stats: %s", out)
	}
	if out := inboxRun(t, 0, "prune", "--mysql", dsn, "--dry-run"); !strings.Contains(out, "would delete 3 markers") {
		t.Fatalf("prune --dry-run: %s", out)
	}
	if out := inboxRun(t, 0, "prune", "--mysql", dsn, "--batch", "2"); !strings.Contains(out, "deleted 3 markers") || !strings.Contains(out, "in 2 transactions") {
		t.Fatalf("prune: %s", out)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_inbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after prune: %d %v", n, err)
	}
	if out := inboxRun(t, 0, "window", "set", "720h", "--mysql", dsn); !strings.Contains(out, "window 336h0m0s -> 720h0m0s") {
		t.Fatalf("window set: %s", out)
	}
	if out := inboxRun(t, 0, "window", "show", "--mysql", dsn); !strings.Contains(out, "window   720h0m0s") {
		t.Fatalf("window show: %s", out)
	}
	// A table that is not an inbox: the command says how to make one.
	_, errOut := inboxRunErr(t, 3, "stats", "--mysql", dsn, "--table", "other_inbox")
	if !strings.Contains(errOut, "idem inbox migrate --table other_inbox --mysql") || strings.Contains(errOut, "root@") {
		t.Errorf("stats of a missing table: %s", errOut)
	}

	// The DDL for MySQL, applied to another database, is what migrate
	// built: check finds it up to date.
	ddl := inboxRun(t, 0, "ddl", "--dialect", "mysql")
	other := mysqltest.Database(t, "idem_cli_")
	odb, err := mysqlinbox.Open(other.FormatDSN() + "?multiStatements=true")
	if err != nil {
		t.Fatal(err)
	}
	defer odb.Close()
	if _, err := odb.ExecContext(ctx, ddl); err != nil {
		t.Fatalf("applying idem inbox ddl --dialect mysql: %v\n%s", err, ddl)
	}
	if out := inboxRun(t, 0, "check", "--mysql", other.FormatDSN()); !strings.Contains(out, "idem_inbox: OK") {
		t.Fatalf("check after the DDL: %s", out)
	}
}

// TestInboxMySQLFlagErrors: a wrong database flag is refused before any
// connection, saying which flag takes what.
func TestInboxMySQLFlagErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stats", "--mysql", "mysql://root@127.0.0.1:3306/test"}, "not a URL: user:password@tcp(host:3306)/database"},
		{[]string{"stats", "--mysql", "postgres://u:secret@h/db"}, "is a PostgreSQL URL: give it with --database"},
		{[]string{"stats", "--mysql", "root@tcp(127.0.0.1:3306)/"}, "--mysql names no database"},
		{[]string{"stats", "--mysql", "root@tcp(127.0.0.1:3306)/test", "--database", "postgres://h/db"}, "--mysql and --database name two databases"},
		{[]string{"stats", "--mysql", "root@tcp(127.0.0.1:3306)/test", "--table", "s.t"}, "MySQL tables take no schema"},
		{[]string{"prune", "--database", "root@tcp(127.0.0.1:3306)/test"}, "for MySQL or MariaDB give the DSN with --mysql"},
		{[]string{"migrate", "--mysql", "root@tcp(127.0.0.1:3306)/test", "--layout", "partitioned"}, "plain layout"},
		{[]string{"ddl", "--dialect", "oracle"}, "want postgres, sqlite or mysql"},
	} {
		_, errOut := inboxRunErr(t, 2, c.args...)
		if !strings.Contains(errOut, c.want) || strings.Contains(errOut, "secret") {
			t.Errorf("idem inbox %s: %s, want %q", strings.Join(c.args, " "), errOut, c.want)
		}
	}
}

// TestInboxMySQLSilent: a MySQL server that accepts the connection and
// never answers fails the command within --connect-timeout (exit 3),
// naming the timeout.
func TestInboxMySQLSilent(t *testing.T) {
	t.Parallel()
	cfg := mysqltest.Database(t, "idem_cli_")
	p := netfault.New(t, cfg.Addr)
	p.Freeze()
	cfg.Addr = p.Addr()
	_, errOut := inboxRunErr(t, 3, "stats", "--mysql", cfg.FormatDSN(), "--connect-timeout", "1s")
	if !strings.Contains(errOut, "no answer within 1s (--connect-timeout)") {
		t.Errorf("stats on a silent server: %s", errOut)
	}
	if p.Accepted() == 0 {
		t.Error("the command never connected to the silent server")
	}
}
