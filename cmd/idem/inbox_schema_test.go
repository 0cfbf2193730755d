package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/sqlinbox"
)

// TestInboxDDLIsTheLibrarys: the plain output is the library's DDL, for
// every dialect and layout.
func TestInboxDDLIsTheLibrarys(t *testing.T) {
	t.Parallel()
	for _, layout := range []pgxinbox.Layout{pgxinbox.Plain, pgxinbox.Partitioned} {
		want, err := pgxinbox.DDL("billing.inbox", layout, 48*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		got := inboxRun(t, 0, "ddl", "--table", "billing.inbox", "--layout", layout.String(), "--window", "48h")
		if got != want {
			t.Fatalf("ddl --layout %s differs from pgxinbox.DDL:\n%s\n---\n%s", layout, got, want)
		}
		if !strings.Contains(got, "172800000") {
			t.Fatalf("the DDL does not record the 48h window:\n%s", got)
		}
	}
	want, err := sqlinbox.DDL(sqlinbox.SQLite, "app_inbox", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := inboxRun(t, 0, "ddl", "--dialect", "sqlite", "--table", "app_inbox"); got != want {
		t.Fatalf("ddl --dialect sqlite differs from sqlinbox.DDL:\n%s\n---\n%s", got, want)
	}
	down, err := pgxinbox.DownDDL("idem_inbox", pgxinbox.Plain)
	if err != nil {
		t.Fatal(err)
	}
	if got := inboxRun(t, 0, "ddl", "--down"); got != down {
		t.Fatalf("ddl --down differs from pgxinbox.DownDDL:\n%s\n---\n%s", got, down)
	}
	for _, bad := range [][]string{
		{"ddl", "--layout", "sideways"}, {"ddl", "--dialect", "oracle"}, {"ddl", "--format", "liquibase"},
		{"ddl", "--dialect", "sqlite", "--layout", "partitioned"}, {"ddl", "--table", "a.b.c"},
		{"ddl", "--from-version", "99"}, {"ddl", "--format", "golang-migrate"}, {"ddl", "--window", "0s"},
	} {
		inboxRunErr(t, 2, bad...)
	}
}

// gooseStatements splits a goose migration's section as goose does: at a
// semicolon ending a line, except between StatementBegin and StatementEnd.
func gooseStatements(section string) []string {
	var out []string
	var cur strings.Builder
	inBlock := false
	for line := range strings.Lines(section) {
		switch strings.TrimSpace(line) {
		case "-- +goose StatementBegin":
			inBlock = true
			continue
		case "-- +goose StatementEnd":
			inBlock = false
			out = append(out, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteString(line)
		if !inBlock && strings.HasSuffix(strings.TrimSpace(line), ";") {
			out = append(out, cur.String())
			cur.Reset()
		}
	}
	if strings.TrimSpace(cur.String()) != "" {
		out = append(out, cur.String())
	}
	return out
}

// gooseSections cuts a goose file into its up and down sections.
func gooseSections(t *testing.T, file string) (up, down string) {
	t.Helper()
	rest, ok := strings.CutPrefix(file, "-- +goose Up\n")
	if !ok {
		t.Fatalf("goose file does not start with -- +goose Up:\n%s", file)
	}
	up, down, ok = strings.Cut(rest, "\n-- +goose Down\n")
	if !ok {
		t.Fatalf("goose file without -- +goose Down:\n%s", file)
	}
	return up, down
}

func withoutGooseAnnotations(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !strings.HasPrefix(line, "-- +goose ") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// TestInboxDDLGoose: the goose file's up section is the plain DDL with
// every PL/pgSQL block between StatementBegin and StatementEnd; split as
// goose splits it, statement by statement, it makes a table the check
// finds clean, and its down section removes it.
func TestInboxDDLGoose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	file := inboxRun(t, 0, "ddl", "--format", "goose")
	up, down := gooseSections(t, file)
	if plain := inboxRun(t, 0, "ddl"); withoutGooseAnnotations(up) != plain {
		t.Fatalf("goose up section differs from the plain DDL:\n%s\n---\n%s", up, plain)
	}
	if n := strings.Count(up, "-- +goose StatementBegin"); n != strings.Count(up, "DO $idem$") || n == 0 {
		t.Fatalf("%d StatementBegin for %d PL/pgSQL blocks:\n%s", n, strings.Count(up, "DO $idem$"), up)
	}
	url := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range gooseStatements(up) {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatalf("goose statement failed: %v\n%s", err, stmt)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if out := inboxRun(t, 0, "check", "--database", url); out != "idem_inbox: OK\n" {
		t.Fatalf("check after goose up: %q", out)
	}
	if out := inboxRun(t, 0, "migrate", "--database", url); !strings.Contains(out, "idem_inbox is up to date (schema version 2)") {
		t.Fatalf("migrate after goose up: %q", out)
	}
	for _, stmt := range gooseStatements(down) {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("goose down statement failed: %v\n%s", err, stmt)
		}
	}
	if out, _ := inboxRunErr(t, 1, "check", "--database", url); !strings.Contains(out, "idem_inbox does not exist") {
		t.Fatalf("check after goose down: %q", out)
	}
}

// TestInboxDDLFiles: golang-migrate, goose and flyway files are named as
// those tools require, numbered after the files already there, never
// overwritten, and hold the plain DDL.
func TestInboxDDLFiles(t *testing.T) {
	t.Parallel()
	plain := inboxRun(t, 0, "ddl")
	down := inboxRun(t, 0, "ddl", "--down")
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "000007_orders.up.sql"), []byte("SELECT 1;"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := inboxRun(t, 0, "ddl", "--format", "golang-migrate", "--out", dir)
	up, dn := filepath.Join(dir, "000008_idem_inbox.up.sql"), filepath.Join(dir, "000008_idem_inbox.down.sql")
	if !strings.Contains(out, up) || !strings.Contains(out, dn) {
		t.Fatalf("golang-migrate wrote %q, want %s and %s", out, up, dn)
	}
	if read(up) != plain || read(dn) != down {
		t.Fatalf("golang-migrate files differ from the plain DDL:\n%s\n---\n%s", read(up), read(dn))
	}
	inboxRunErr(t, 3, "ddl", "--format", "golang-migrate", "--out", dir, "--seq", "8")
	if out := inboxRun(t, 0, "ddl", "--format", "golang-migrate", "--out", dir, "--from-version", "1"); !strings.Contains(out, "000009_idem_inbox_to_v2.up.sql") || strings.Contains(out, "down") {
		t.Fatalf("upgrade files: %q, want 000009_idem_inbox_to_v2.up.sql alone", out)
	}

	gdir := t.TempDir()
	out = inboxRun(t, 0, "ddl", "--format", "goose", "--out", gdir)
	gfile := filepath.Join(gdir, "00001_idem_inbox.sql")
	if !strings.Contains(out, gfile) {
		t.Fatalf("goose wrote %q, want %s", out, gfile)
	}
	if gup, _ := gooseSections(t, read(gfile)); withoutGooseAnnotations(gup) != plain {
		t.Fatalf("goose file's up section differs from the plain DDL")
	}

	fdir := t.TempDir()
	if err := os.WriteFile(filepath.Join(fdir, "V3__orders.sql"), []byte("SELECT 1;"), 0o644); err != nil {
		t.Fatal(err)
	}
	out = inboxRun(t, 0, "ddl", "--format", "flyway", "--out", fdir)
	ffile := filepath.Join(fdir, "V4__idem_inbox.sql")
	if !strings.Contains(out, ffile) || read(ffile) != plain {
		t.Fatalf("flyway wrote %q, want %s with the plain DDL", out, ffile)
	}
}

// TestInboxDDLFromVersion: --from-version 1 renders only the second
// migration, and upgrades a table of the first release to one the check
// finds clean.
func TestInboxDDLFromVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	out := inboxRun(t, 0, "ddl", "--from-version", "1")
	if strings.Contains(out, "0001_inbox.sql") || !strings.Contains(out, "0002_keep_until.sql") {
		t.Fatalf("--from-version 1 rendered:\n%s", out)
	}
	url := pgtest.Schema(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The first release's table and bookkeeping.
	if _, err := pool.Exec(ctx, `CREATE TABLE idem_inbox (
    consumer     text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    message_id   text        NOT NULL,
    body_sha256  bytea       NOT NULL,
    event_time   timestamptz,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key)
);
CREATE INDEX idem_inbox_processed_at_idx ON idem_inbox (processed_at);
CREATE TABLE idem_migrations (table_name text PRIMARY KEY, version int NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
INSERT INTO idem_migrations (table_name, version) VALUES ('"idem_inbox"', 1);`); err != nil {
		t.Fatal(err)
	}
	if out, _ := inboxRunErr(t, 1, "check", "--database", url); !strings.Contains(out, "schema version 1; this build needs version 2") {
		t.Fatalf("check of a version 1 table: %q", out)
	}
	if _, err := pool.Exec(ctx, out); err != nil {
		t.Fatalf("applying --from-version 1: %v", err)
	}
	if got := inboxRun(t, 0, "check", "--database", url); got != "idem_inbox: OK\n" {
		t.Fatalf("check after the upgrade: %q", got)
	}
}

// TestInboxCheck: OK on a migrated table; each problem with its fix, exit
// 1, on a broken one (text and JSON); exit 3 when the database cannot be
// reached.
func TestInboxCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Schema(t)
	inboxRun(t, 0, "migrate", "--database", url, "--layout", "partitioned", "--table", "orders_inbox")
	if out := inboxRun(t, 0, "check", "--database", url, "--table", "orders_inbox"); out != "orders_inbox: OK\n" {
		t.Fatalf("check of a migrated table: %q", out)
	}
	out, _ := inboxRunErr(t, 1, "check", "--database", url, "--table", "orders_inbox", "--layout", "plain")
	if !strings.Contains(out, "has the partitioned layout, but the store is configured for the plain layout") {
		t.Fatalf("check --layout plain of a partitioned table: %q", out)
	}

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `DROP TABLE orders_inbox; CREATE TABLE orders_inbox (id bigserial PRIMARY KEY, body jsonb)`); err != nil {
		t.Fatal(err)
	}
	out, _ = inboxRunErr(t, 1, "check", "--database", url, "--table", "orders_inbox")
	if !strings.Contains(out, "no column consumer, key, message_id") || !strings.Contains(out, "  fix: ") {
		t.Fatalf("check of a table of another shape: %q", out)
	}
	var res struct {
		Table    string `json:"table"`
		OK       bool   `json:"ok"`
		Problems []struct{ What, Fix string }
	}
	out, _ = inboxRunErr(t, 1, "check", "--database", url, "--table", "orders_inbox", "--json")
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.OK || res.Table != "orders_inbox" || len(res.Problems) == 0 || res.Problems[0].Fix == "" {
		t.Fatalf("check --json: %q (%v)", out, err)
	}
	if out, _ := inboxRunErr(t, 1, "check", "--database", url, "--table", "nothing_here"); !strings.Contains(out, "nothing_here does not exist") ||
		!strings.Contains(out, "fix: idem inbox migrate --table nothing_here") {
		t.Fatalf("check of a missing table: %q", out)
	}

	// A closed port: the check cannot run.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if _, stderr := inboxRunErr(t, 3, "check", "--database", "postgres://postgres@"+addr+"/test?sslmode=disable"); !strings.Contains(stderr, "connecting to postgres://postgres@"+addr) {
		t.Fatalf("check of an unreachable database: %q", stderr)
	}

	file := filepath.Join(t.TempDir(), "app.db")
	inboxRun(t, 0, "migrate", "--sqlite", file)
	if out := inboxRun(t, 0, "check", "--sqlite", file); out != "idem_inbox: OK\n" {
		t.Fatalf("check --sqlite: %q", out)
	}
}

// TestInboxMigrateSaysWhatItDid: created, then up to date (an upgrade's
// sentence is pinned in package pgxinbox).
func TestInboxMigrateSaysWhatItDid(t *testing.T) {
	t.Parallel()
	url := pgtest.Schema(t)
	if out := inboxRun(t, 0, "migrate", "--database", url, "--window", "720h"); out != "created idem_inbox (plain layout, window 30d, schema version 2)\n" {
		t.Fatalf("first migrate: %q", out)
	}
	if out := inboxRun(t, 0, "migrate", "--database", url); out != "idem_inbox is up to date (schema version 2)\n" {
		t.Fatalf("second migrate: %q", out)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(inboxRun(t, 0, "migrate", "--database", url, "--json")), &res); err != nil ||
		res["from"] != float64(2) || res["to"] != float64(2) || res["created"] != false || res["window"] != "720h0m0s" {
		t.Fatalf("migrate --json: %v %v", res, err)
	}
	file := filepath.Join(t.TempDir(), "app.db")
	if out := inboxRun(t, 0, "migrate", "--sqlite", file); out != "created idem_inbox (plain layout, window 14d, schema version 2)\n" {
		t.Fatalf("migrate --sqlite: %q", out)
	}
}
