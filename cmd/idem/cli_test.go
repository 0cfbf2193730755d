package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// cliResult is one run of the command line.
type cliResult struct {
	code           int
	stdout, stderr string
}

// cli runs idem with args under a generous deadline of its own, so that a
// command that hangs fails the test instead of stalling it.
func cli(t *testing.T, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, args, &out, &errb)
	if ctx.Err() != nil {
		t.Fatalf("idem %s: still running after the test's deadline", strings.Join(args, " "))
	}
	return cliResult{code, out.String(), errb.String()}
}

// expect fails the test unless the run exited with code.
func (r cliResult) expect(t *testing.T, code int, args []string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("idem %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
}

// jsonError parses the error object a --json run prints on stdout.
type jsonError struct {
	Error   string `json:"error"`
	Exit    int    `json:"exit"`
	Command string `json:"command"`
}

func parseJSONError(t *testing.T, r cliResult, args []string) jsonError {
	t.Helper()
	var je jsonError
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&je); err != nil {
		t.Fatalf("idem %s: stdout %q is not one JSON error object: %v", strings.Join(args, " "), r.stdout, err)
	}
	if dec.More() {
		t.Fatalf("idem %s: stdout %q holds more than one JSON value", strings.Join(args, " "), r.stdout)
	}
	return je
}

// helpArgs lists every way to ask the commands this file covers for help.
func helpArgs() [][]string {
	cases := [][]string{
		{"-h"}, {"--help"}, {"help"}, {"help", "inbox"}, {"help", "audit", "check"},
		{"inbox", "-h"}, {"inbox", "--help"}, {"inbox", "help"},
		{"inbox", "partitions", "-h"}, {"inbox", "window", "--help"},
		{"audit", "-h"}, {"audit", "--help"}, {"version", "-h"}, {"version", "--help"},
	}
	for name := range inboxCommands {
		words := append([]string{"inbox"}, strings.Fields(name)...)
		cases = append(cases, append(words, "-h"), append(words, "--help"))
	}
	for _, sub := range []string{"duplicates", "void", "guard", "check"} {
		cases = append(cases, []string{"audit", sub, "-h"}, []string{"audit", sub, "--help"})
	}
	return cases
}

// TestHelpOnStdout: every command and subcommand prints its help on
// stdout for -h and --help and exits 0, with nothing on stderr; the help of
// a command with flags lists them as typed, with two dashes.
func TestHelpOnStdout(t *testing.T) {
	t.Parallel()
	for _, args := range helpArgs() {
		r := cli(t, args...)
		r.expect(t, 0, args)
		if !strings.HasPrefix(r.stdout, "usage: idem") || r.stderr != "" {
			t.Fatalf("idem %s: stdout %q, stderr %q: want the help on stdout only", strings.Join(args, " "), r.stdout, r.stderr)
		}
		if len(args) > 1 && (args[0] == "inbox" || args[0] == "audit") && len(args) >= 3 && args[1] != "partitions" && args[1] != "window" {
			if !strings.Contains(r.stdout, "  --table ") || regexp.MustCompile(`(?m)^  -[a-z]`).MatchString(r.stdout) {
				t.Fatalf("idem %s: flags not listed as --flag:\n%s", strings.Join(args, " "), r.stdout)
			}
		}
	}
	// The top-level help documents the exit codes and the JSON error.
	r := cli(t, "-h")
	for _, want := range []string{"0  success", "1  findings", "2  usage", "3  runtime", `{"error": "...", "exit": N`, "--connect-timeout"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("idem -h lacks %q:\n%s", want, r.stdout)
		}
	}
	// So does a subcommand's, with the default connect timeout.
	if r := cli(t, "inbox", "stats", "-h"); !strings.Contains(r.stdout, "--connect-timeout duration") || !strings.Contains(r.stdout, "(default 10s)") ||
		!strings.Contains(r.stdout, "exit status: 0 ok, 1 findings, 2 usage, 3 runtime") {
		t.Fatalf("idem inbox stats -h:\n%s", r.stdout)
	}
}

// TestUsageErrors: a mistake in the command line exits 2, says on stderr
// what is wrong with the flag named as typed, and where the help is; stdout
// stays empty.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{}, []string{"usage: idem <command>"}},
		{[]string{"nosuch"}, []string{`idem: unknown command "nosuch"`, "Run 'idem -h'"}},
		{[]string{"inbox"}, []string{"missing subcommand", "Run 'idem inbox -h'"}},
		{[]string{"inbox", "nosuch"}, []string{`unknown subcommand "nosuch"`, "partitions drop"}},
		{[]string{"inbox", "partitions"}, []string{"idem inbox partitions: want a subcommand: drop or ensure", "Run 'idem inbox partitions -h'"}},
		{[]string{"inbox", "window", "nosuch"}, []string{`idem inbox window: unknown subcommand "nosuch" (want set or show)`}},
		{[]string{"inbox", "stats", "--bogus"}, []string{"idem inbox stats: unknown flag --bogus", "Run 'idem inbox stats -h' for usage."}},
		{[]string{"inbox", "stats", "extra"}, []string{`unexpected argument "extra"`}},
		{[]string{"inbox", "prune", "--batch", "0"}, []string{"--batch must be positive (got 0)"}},
		{[]string{"inbox", "prune", "--batch", "-3"}, []string{"--batch must be positive (got -3)"}},
		{[]string{"inbox", "prune", "--batch", "many"}, []string{`--batch "many": want a whole number`}},
		{[]string{"inbox", "prune", "--window", "2weeks"}, []string{`--window "2weeks": want a duration`}},
		{[]string{"inbox", "prune", "--window", "-1h"}, []string{"--window must be positive"}},
		{[]string{"inbox", "prune", "--dry-run=maybe"}, []string{`--dry-run="maybe": want true or false`}},
		{[]string{"inbox", "prune", "--table"}, []string{"--table needs a value"}},
		{[]string{"inbox", "prune", "--table", ""}, []string{"--table must not be empty"}},
		{[]string{"inbox", "partitions", "ensure", "--days", "0"}, []string{"--days must be positive (got 0)"}},
		{[]string{"inbox", "partitions", "ensure", "--from", "tomorrow"}, []string{`--from "tomorrow": want a day as YYYY-MM-DD`}},
		{[]string{"inbox", "stats", "--connect-timeout", "-1s"}, []string{"--connect-timeout must not be negative"}},
		{[]string{"inbox", "stats", "--sqlite", "a.db", "--database", "postgres://x/y"}, []string{"--sqlite and --database name two databases"}},
		{[]string{"inbox", "stats", "--table", "a;b"}, []string{`--table "a;b": want a table name`}},
		{[]string{"inbox", "migrate", "--sqlite", "a.db", "--table", "s.t"}, []string{`--table "s.t": SQLite tables take no schema`}},
		{[]string{"inbox", "stats", "--database", "not a url"}, []string{"--database not a url is not a PostgreSQL URL", "Run 'idem inbox stats -h'"}},
		{[]string{"audit", "check", "--table", "t", "--key", "k", "--database", "not a url"}, []string{"--database not a url is not a PostgreSQL URL"}},
		{[]string{"inbox", "migrate", "--layout", "sharded"}, []string{`--layout "sharded": want plain or partitioned`}},
		{[]string{"inbox", "window", "set", "soon"}, []string{`"soon" is not a positive duration`, "Run 'idem inbox window set -h'"}},
		{[]string{"audit"}, []string{"missing subcommand", "Run 'idem audit -h'"}},
		{[]string{"audit", "check", "--table", "t"}, []string{"idem audit check: --key is required"}},
		{[]string{"audit", "check", "--key", "k"}, []string{"--table is required"}},
		{[]string{"audit", "check", "--table", "t", "--key", "k", "--every", "-1h"}, []string{"--every must be positive"}},
		{[]string{"audit", "duplicates", "--table", "t", "--key", "k", "--limit", "-1"}, []string{"--limit must not be negative"}},
		{[]string{"audit", "void", "--table", "t", "--key", "k", "--lock-timeout", "-1s"}, []string{"--lock-timeout must not be negative"}},
		{[]string{"audit", "guard", "--print", "--table", "t", "--key", "k", "--status-column", "a b"}, []string{"--status-column: invalid SQL name"}},
		{[]string{"audit", "void", "--table", "t", "--key", "k", "--status-column", "-"}, []string{"void marks rows by their --status-column"}},
		{[]string{"audit", "void", "--table", "t", "--key", "k", "--id", ""}, []string{"void names every row it voids by its --id column"}},
		{[]string{"audit", "check", "--table", "t", "--key", "k", "--time", ""}, []string{"--time must name the creation time column"}},
		{[]string{"audit", "check", "--table", "t", "--key", "k", "--void-value", ""}, []string{"--void-value must not be empty"}},
		{[]string{"audit", "check", "--table", "t", "--key", "k", "--paid-value", ","}, []string{"--paid-value must name at least one status"}},
		{[]string{"audit", "void", "--table", "t", "--key", "k", "--reason-column", ""}, []string{"--reason-column must name a column"}},
		{[]string{"audit", "void", "--table", "t", "--key", "k", "--quiet-period", "0"}, []string{"--quiet-period must be positive"}},
		{[]string{"version", "extra"}, []string{`unexpected argument "extra"`}},
	} {
		r := cli(t, tc.args...)
		r.expect(t, 2, tc.args)
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Fatalf("idem %s: stderr %q lacks %q", strings.Join(tc.args, " "), r.stderr, w)
			}
		}
		if r.stdout != "" {
			t.Fatalf("idem %s: stdout %q, want nothing", strings.Join(tc.args, " "), r.stdout)
		}
	}
}

// goSelector matches a Go field or type reference such as VoidOptions.Force.
var goSelector = regexp.MustCompile(`\b[A-Z][A-Za-z]*(Options|Config|Spec|Result)\.[A-Z][A-Za-z]*\b|store's Migrate`)

// TestMessagesInUserTerms: refusals and errors name flags and commands,
// never the library's Go names.
func TestMessagesInUserTerms(t *testing.T) {
	t.Parallel()
	db := auditSeed(t, `INSERT INTO invoices (customer_id, period, amount, status, created_at) VALUES
		('c-9', '2026-04', 1.00, 'Issued', now()), ('c-9', '2026-04', 1.00, 'Issued', now());`)
	common := []string{"--database", db, "--table", "invoices", "--key", "customer_id,period"}
	for _, tc := range []struct {
		code int
		args []string
		want string
	}{
		{3, []string{"audit", "void"}, "add them with --add-columns"},
		{1, []string{"audit", "void", "--add-columns"}, "or pass --force"},
		{1, []string{"audit", "guard"}, "void them first (idem audit void)"},
	} {
		args := append(tc.args, common...)
		r := cli(t, args...)
		r.expect(t, tc.code, args)
		if !strings.Contains(r.stderr, tc.want) {
			t.Fatalf("idem %s: stderr %q lacks %q", strings.Join(args, " "), r.stderr, tc.want)
		}
		if m := goSelector.FindString(r.stdout + r.stderr); m != "" {
			t.Fatalf("idem %s names %q:\n%s%s", strings.Join(args, " "), m, r.stdout, r.stderr)
		}
	}
}

// TestRuntimeErrorsExit3: the same failure, a database that is not there,
// exits 3 from every command that needs it, with one line on stderr.
func TestRuntimeErrorsExit3(t *testing.T) {
	t.Parallel()
	// A port that was just closed: connections are refused at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	down := "postgres://postgres@" + addr + "/test?sslmode=disable"
	for _, args := range [][]string{
		{"inbox", "migrate"}, {"inbox", "stats"}, {"inbox", "prune"}, {"inbox", "prune", "--dry-run"},
		{"inbox", "partitions", "ensure"}, {"inbox", "partitions", "drop"}, {"inbox", "window", "show"}, {"inbox", "window", "set", "720h"},
		{"audit", "duplicates", "--table", "t", "--key", "k"}, {"audit", "void", "--table", "t", "--key", "k"},
		{"audit", "guard", "--table", "t", "--key", "k"}, {"audit", "check", "--table", "t", "--key", "k"},
	} {
		args = append(args, "--database", down)
		r := cli(t, args...)
		r.expect(t, 3, args)
		want := "idem " + strings.Join(args[:2], " ")
		if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], want) ||
			!strings.Contains(lines[0], "connecting to postgres://postgres@"+addr) {
			t.Fatalf("idem %s: stderr %q, want one line from %q naming the database", strings.Join(args, " "), r.stderr, want)
		}
	}
}

// silentServer accepts TCP connections and never answers, as a database
// host behind a dead switch or a process that stopped reading. It reports
// how many connections it accepted; first is closed on the first one.
func silentServer(t *testing.T) (addr string, accepted func() int, first <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	firstc := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read or written
			if len(conns) == 1 {
				close(firstc)
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return len(conns) }, firstc
}

// TestConnectTimeout: a server that accepts the connection and never
// answers fails the command with exit 3 and a message naming the timeout,
// instead of hanging it until killed (cli's deadline would fail the test).
func TestConnectTimeout(t *testing.T) {
	t.Parallel()
	addr, accepted, _ := silentServer(t)
	silent := "postgres://postgres@" + addr + "/test?sslmode=disable"
	for _, args := range [][]string{
		{"inbox", "stats", "--database", silent, "--connect-timeout", "300ms"},
		{"inbox", "migrate", "--database", silent, "--connect-timeout", "300ms"},
		{"audit", "check", "--database", silent, "--connect-timeout", "300ms", "--table", "t", "--key", "k"},
		{"audit", "duplicates", "--database", silent, "--connect-timeout", "300ms", "--table", "t", "--key", "k"},
	} {
		before := accepted()
		r := cli(t, args...)
		r.expect(t, 3, args)
		if !strings.Contains(r.stderr, "no answer within 300ms (--connect-timeout)") || !strings.Contains(r.stderr, addr) {
			t.Fatalf("idem %s: stderr %q, want the timeout and the server named", strings.Join(args, " "), r.stderr)
		}
		if accepted() == before {
			t.Fatalf("idem %s: the silent server accepted no connection: the failure was not the timeout", strings.Join(args, " "))
		}
	}
	// With --json the same failure is a JSON object on stdout.
	args := []string{"audit", "check", "--json", "--database", silent, "--connect-timeout", "300ms", "--table", "t", "--key", "k"}
	r := cli(t, args...)
	r.expect(t, 3, args)
	if je := parseJSONError(t, r, args); je.Exit != 3 || je.Command != "audit check" || !strings.Contains(je.Error, "--connect-timeout") {
		t.Fatalf("JSON error %+v", je)
	}
}

// TestJSONErrors: with --json, an error is one JSON object on stdout (the
// plain line stays on stderr), for usage and runtime errors alike; findings
// print their result only.
func TestJSONErrors(t *testing.T) {
	t.Parallel()
	url := pgtest.Schema(t)
	for _, tc := range []struct {
		code    int
		args    []string
		command string
		want    string
	}{
		{2, []string{"inbox", "stats", "--json", "--bogus"}, "inbox stats", "unknown flag --bogus"},
		{2, []string{"inbox", "prune", "--batch", "0", "--json"}, "inbox prune", "--batch must be positive"},
		{2, []string{"nosuch", "--json"}, "", `unknown command "nosuch"`},
		{2, []string{"inbox", "partitions", "--json"}, "inbox partitions", "want a subcommand"},
		{3, []string{"inbox", "stats", "--json", "--database", url, "--table", "missing"}, "inbox stats", "table missing does not exist"},
		{3, []string{"inbox", "window", "show", "--json=true", "--database", url, "--table", "missing"}, "inbox window show", "table missing does not exist"},
		{3, []string{"audit", "check", "--json", "--database", url, "--table", "missing", "--key", "k"}, "audit check", "table missing: not found"},
	} {
		r := cli(t, tc.args...)
		r.expect(t, tc.code, tc.args)
		je := parseJSONError(t, r, tc.args)
		if je.Exit != tc.code || je.Command != tc.command || !strings.Contains(je.Error, tc.want) {
			t.Fatalf("idem %s: JSON error %+v, want exit %d, command %q, error with %q", strings.Join(tc.args, " "), je, tc.code, tc.command, tc.want)
		}
		if !strings.Contains(r.stderr, tc.want) {
			t.Fatalf("idem %s: stderr %q, want the plain message too", strings.Join(tc.args, " "), r.stderr)
		}
	}
	// Without --json, stdout stays empty.
	if r := cli(t, "inbox", "stats", "--database", url, "--table", "missing"); r.code != 3 || r.stdout != "" {
		t.Fatalf("without --json: exit %d, stdout %q", r.code, r.stdout)
	}
	// --json=false is no JSON.
	if r := cli(t, "inbox", "stats", "--json=false", "--bogus"); r.code != 2 || r.stdout != "" {
		t.Fatalf("--json=false: exit %d, stdout %q", r.code, r.stdout)
	}
	// Findings (exit 1) print the result, one JSON document, not an error.
	db := auditSeed(t, "")
	args := []string{"audit", "check", "--json", "--database", db, "--table", "invoices", "--key", "customer_id,period"}
	r := cli(t, args...)
	r.expect(t, 1, args)
	var res map[string]any
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	if err := dec.Decode(&res); err != nil || dec.More() || res["groups"] != float64(5) || res["error"] != nil {
		t.Fatalf("check --json with duplicates: %q (%v), want one result with 5 groups", r.stdout, err)
	}
	args = []string{"audit", "guard", "--json", "--database", db, "--table", "invoices", "--key", "customer_id,period"}
	r = cli(t, args...)
	r.expect(t, 1, args)
	dec = json.NewDecoder(strings.NewReader(r.stdout))
	if err := dec.Decode(&res); err != nil || dec.More() || res["groups"] != float64(5) || res["created"] != false {
		t.Fatalf("guard --json with duplicates: %q (%v), want one result with 5 groups, not created", r.stdout, err)
	}
}

// TestNotAnInbox: a table that is not an idem inbox, or is missing, is
// refused in one line that says how to make it one, by every inbox
// command, instead of a SQL error about a column.
func TestNotAnInbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// One schema with an inbox beside the stranger (its settings table
	// exists), one with the stranger alone.
	withInbox := pgtest.Schema(t)
	alone := pgtest.Schema(t)
	for _, url := range []string{withInbox, alone} {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE t_notinbox (id int, event_name text)`); err != nil {
			t.Fatal(err)
		}
		if url == withInbox {
			store, err := pgxinbox.New(pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
		}
		pool.Close()
	}
	// The table lacks the columns every inbox version had: migrate would
	// refuse it, so the fix is another table, not migrate.
	const want = "table t_notinbox exists and is not an idem inbox (it has no column consumer, key, message_id, body_sha256, event_time, processed_at): " +
		"name another table with --table, or rename it aside"
	for _, url := range []string{withInbox, alone} {
		for _, sub := range [][]string{{"stats"}, {"prune"}, {"prune", "--dry-run"}, {"window", "show"}, {"window", "set", "720h"}, {"partitions", "drop"}, {"partitions", "ensure"}, {"migrate"}} {
			args := append(append([]string{"inbox"}, sub...), "--database", url, "--table", "t_notinbox")
			r := cli(t, args...)
			r.expect(t, 3, args)
			if got := strings.TrimSpace(r.stderr); !strings.HasPrefix(got, "idem inbox ") || !strings.HasSuffix(got, ": "+want) || strings.Contains(got, "\n") {
				t.Fatalf("idem %s: stderr %q, want one line ending %q", strings.Join(args, " "), r.stderr, want)
			}
		}
	}
	args := []string{"inbox", "stats", "--database", alone, "--table", "nosuch"}
	r := cli(t, args...)
	r.expect(t, 3, args)
	if !strings.Contains(r.stderr, "table nosuch does not exist in this database (wrong --table or --database?); create it with: idem inbox migrate --table nosuch") {
		t.Fatalf("missing table: %q", r.stderr)
	}
	// SQLite: a database file without an inbox, and a file that is not there.
	file := filepath.Join(t.TempDir(), "app.db")
	db, err := sqliteinbox.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id integer)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	args = []string{"inbox", "stats", "--sqlite", file}
	r = cli(t, args...)
	r.expect(t, 3, args)
	if !strings.Contains(r.stderr, "table idem_inbox is not an idem inbox (no stored settings); create it with: idem inbox migrate --table idem_inbox --sqlite "+file) {
		t.Fatalf("sqlite without inbox: %q", r.stderr)
	}
	// SQLite: a table of that name that is no inbox; migrate refuses it in
	// the same words, and leaves it as it was.
	other := filepath.Join(t.TempDir(), "other.db")
	db, err = sqliteinbox.Open(other)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE idem_inbox (a integer, b text)`); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"stats", "migrate"} {
		args = []string{"inbox", sub, "--sqlite", other}
		r = cli(t, args...)
		r.expect(t, 3, args)
		want := "idem inbox " + sub + ": table idem_inbox exists and is not an idem inbox (it has no column consumer, key, message_id, body_sha256, event_time, processed_at): name another table with --table, or rename it aside\n"
		if r.stderr != want {
			t.Fatalf("idem %s: stderr %q, want %q", strings.Join(args, " "), r.stderr, want)
		}
	}
	var cols int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info('idem_inbox')`).Scan(&cols); err != nil || cols != 2 {
		t.Fatalf("after the refused migrate the table has %d columns (%v), want its 2", cols, err)
	}
	missing := filepath.Join(t.TempDir(), "missing.db")
	args = []string{"inbox", "prune", "--sqlite", missing}
	r = cli(t, args...)
	r.expect(t, 3, args)
	if !strings.Contains(r.stderr, "SQLite file "+missing+" does not exist (wrong --sqlite?)") {
		t.Fatalf("missing sqlite file: %q", r.stderr)
	}
}

// TestPruneSaysWhatItWouldDo: a dry run says in words how many markers it
// would delete and that it deleted none; a run with nothing to do says so.
func TestPruneSaysWhatItWouldDo(t *testing.T) {
	t.Parallel()
	url, pool := seedInbox(t, pgxinbox.Plain)
	out := inboxRun(t, 0, "prune", "--database", url, "--dry-run", "--batch", "2")
	if !regexp.MustCompile(`^idem_inbox: dry run: would delete 3 markers older than \S+, in batches of 2; nothing deleted\n$`).MatchString(out) || rows(t, pool) != 4 {
		t.Fatalf("dry run said %q, left %d rows", out, rows(t, pool))
	}
	inboxRun(t, 0, "prune", "--database", url)
	out = inboxRun(t, 0, "prune", "--database", url, "--dry-run")
	if !strings.Contains(out, "dry run: nothing to delete, no markers older than") || strings.Contains(out, "batches") {
		t.Fatalf("dry run after the prune said %q", out)
	}
	if out := inboxRun(t, 0, "prune", "--database", url); !strings.Contains(out, "nothing to delete") {
		t.Fatalf("prune with nothing to do said %q", out)
	}
	purl, _ := seedInbox(t, pgxinbox.Partitioned)
	out = inboxRun(t, 0, "partitions", "drop", "--database", purl, "--dry-run")
	if !strings.Contains(out, "dry run: would drop") || !strings.Contains(out, "nothing dropped") {
		t.Fatalf("partitions drop --dry-run said %q", out)
	}
	inboxRun(t, 0, "partitions", "drop", "--database", purl)
	for _, args := range [][]string{{"partitions", "drop"}, {"prune"}} {
		args = append(args, "--database", purl, "--dry-run")
		out = inboxRun(t, 0, args...)
		if !strings.Contains(out, ": dry run: nothing to drop, no partitions entirely older than") {
			t.Fatalf("idem inbox %s with nothing to drop said %q", strings.Join(args, " "), out)
		}
	}
}

// TestVersion: the module path, version and source revision come from the
// build information, in text and JSON.
func TestVersion(t *testing.T) {
	t.Parallel()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Skip("test binary built without build information")
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	r := cli(t, "version")
	r.expect(t, 0, []string{"version"})
	if !strings.HasPrefix(r.stdout, "idem ") || !strings.Contains(r.stdout, bi.Main.Path) || !strings.Contains(r.stdout, bi.GoVersion) ||
		!strings.Contains(r.stdout, settings["vcs.revision"]) {
		t.Fatalf("version: %q, want %s, %s and revision %q", r.stdout, bi.Main.Path, bi.GoVersion, settings["vcs.revision"])
	}
	r = cli(t, "version", "--json")
	r.expect(t, 0, []string{"version", "--json"})
	var v struct {
		Module, Version, Revision, Go string
		Modified                      bool
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("version --json: %q: %v", r.stdout, err)
	}
	wantVersion := bi.Main.Version
	if wantVersion == "" {
		wantVersion = "(devel)"
	}
	if v.Module != bi.Main.Path || v.Version != wantVersion || v.Go != bi.GoVersion || v.Revision != settings["vcs.revision"] ||
		v.Modified != (settings["vcs.modified"] == "true") {
		t.Fatalf("version --json %+v, build info %+v", v, bi.Main)
	}
}

// bareTableSQL is a business table without status or id columns, with two
// duplicated keys.
const bareTableSQL = `
CREATE TABLE ledger (
	customer_id text NOT NULL,
	period      text NOT NULL,
	created_at  timestamptz NOT NULL
);
INSERT INTO ledger VALUES
	('c-1', '2026-03', now() - interval '3 days'), ('c-1', '2026-03', now() - interval '3 days' + interval '1 min'),
	('c-2', '2026-03', now() - interval '3 days'), ('c-2', '2026-03', now() - interval '3 days' + interval '1 min'),
	('c-2', '2026-03', now() - interval '3 days' + interval '2 min'), ('c-3', '2026-03', now() - interval '3 days');
`

// TestAuditWithoutStatusOrID: check, duplicates and guard work on a table
// with neither column, with either spelling of "none"; void refuses.
func TestAuditWithoutStatusOrID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := auditSchemaURL(t)
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, bareTableSQL); err != nil {
		t.Fatal(err)
	}
	common := []string{"--database", db, "--table", "ledger", "--key", "customer_id,period"}
	with := func(sub string, more ...string) []string {
		return append(append([]string{"audit", sub}, common...), more...)
	}
	// Before: the default columns are demanded, by name.
	args := with("check")
	r := cli(t, args...)
	r.expect(t, 3, args)
	if !strings.Contains(r.stderr, "has no column status") {
		t.Fatalf("check with the default status column: %q", r.stderr)
	}
	for _, none := range [][]string{{"--status-column", "", "--id", ""}, {"--status-column", "-", "--id", "-"}, {"--status-column=", "--id=-"}} {
		args := with("check", none...)
		r := cli(t, args...)
		r.expect(t, 1, args)
		if !strings.Contains(r.stdout, "2 duplicate groups, 3 extra rows") {
			t.Fatalf("idem %s: %q", strings.Join(args, " "), r.stdout)
		}
	}
	none := []string{"--status-column", "-", "--id", "-"}
	args = with("duplicates", none...)
	r = cli(t, args...)
	r.expect(t, 0, args)
	if !strings.Contains(r.stdout, "live rows: every row (no status column)") || !regexp.MustCompile(`duplicate groups:\s+2\n`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, "void cannot mark the extra rows") || strings.Contains(r.stdout, "-> idem audit void") {
		t.Fatalf("duplicates: %s", r.stdout)
	}
	args = with("guard", append(none, "--print")...)
	r = cli(t, args...)
	r.expect(t, 0, args)
	if strings.TrimSpace(r.stdout) != `CREATE UNIQUE INDEX CONCURRENTLY "ux_ledger_customer_id_period" ON "ledger" ("customer_id", "period");` {
		t.Fatalf("guard --print: %q, want a plain unique index", r.stdout)
	}
	args = with("guard", none...)
	r = cli(t, args...)
	r.expect(t, 1, args)
	if !strings.Contains(r.stderr, "2 groups, 3 extra rows") {
		t.Fatalf("guard with duplicates: %q", r.stderr)
	}
	args = with("void", none...)
	r = cli(t, args...)
	r.expect(t, 2, args)
	if _, err := conn.Exec(ctx, `DELETE FROM ledger l USING ledger e
WHERE l.customer_id = e.customer_id AND l.period = e.period AND l.created_at > e.created_at`); err != nil {
		t.Fatal(err)
	}
	args = with("guard", none...)
	r = cli(t, args...)
	r.expect(t, 0, args)
	if !strings.Contains(r.stdout, "created index ux_ledger_customer_id_period") || strings.Contains(r.stderr, "warning") {
		t.Fatalf("guard: stdout %q stderr %q", r.stdout, r.stderr)
	}
	var def string
	if err := conn.QueryRow(ctx, `SELECT pg_get_indexdef('ux_ledger_customer_id_period'::regclass)`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(def, "WHERE") {
		t.Fatalf("index %s, want no predicate", def)
	}
	args = with("check", none...)
	r = cli(t, args...)
	r.expect(t, 0, args)
	if !strings.Contains(r.stdout, "guarded by ux_ledger_customer_id_period") {
		t.Fatalf("check after guard: %q", r.stdout)
	}
}

// TestInboxDispatcher: every entry of the dispatcher is reachable by its
// words and listed in the inbox help.
func TestInboxDispatcher(t *testing.T) {
	t.Parallel()
	r := cli(t, "inbox", "-h")
	names := make([]string, 0, len(inboxCommands))
	for n := range inboxCommands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(n) + ` +\S`).MatchString(r.stdout) {
			t.Fatalf("inbox help does not list %q:\n%s", n, r.stdout)
		}
		args := append(append([]string{"inbox"}, strings.Fields(n)...), "-h")
		if r := cli(t, args...); r.code != 0 || !strings.HasPrefix(r.stdout, "usage: idem inbox "+n) {
			t.Fatalf("idem %s: exit %d, %q", strings.Join(args, " "), r.code, r.stdout)
		}
	}
}

// TestPasswordsNotPrinted: a failed connection names the database without
// its password, in URL and keyword/value form.
func TestPasswordsNotPrinted(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	for _, db := range []string{
		"postgres://ops:s3cr3t-pw@" + host + ":" + port + "/test?sslmode=disable",
		"host=" + host + " port=" + port + " user=ops password=s3cr3t-pw sslmode=disable",
		"host=" + host + " port=" + port + " user=ops password='s3cr3t pw' sslmode=disable",
	} {
		for _, args := range [][]string{{"inbox", "stats", "--json", "--database", db}, {"audit", "check", "--table", "t", "--key", "k", "--database", db}} {
			r := cli(t, args...)
			r.expect(t, 3, args)
			if strings.Contains(r.stdout+r.stderr, "s3cr3t") || !strings.Contains(r.stderr, "connecting to") {
				t.Fatalf("idem %s: output shows the password or no database:\n%s%s", args[0], r.stdout, r.stderr)
			}
		}
	}
}

// TestAuditEmptyPreviousColumn: an empty --previous-column records nothing, as
// '-' does, instead of silently meaning the default column.
func TestAuditEmptyPreviousColumn(t *testing.T) {
	t.Parallel()
	db := auditSeed(t, "")
	for _, prev := range []string{"", "-"} {
		args := []string{"audit", "void", "--database", db, "--table", "invoices", "--key", "customer_id,period", "--add-columns", "--previous-column", prev}
		r := cli(t, args...)
		r.expect(t, 0, args)
		if !strings.Contains(r.stdout, "columns to add: voided_reason, voided_by, voided_at\n") {
			t.Fatalf("--previous-column %q: %s", prev, r.stdout)
		}
	}
}

// TestOutages: the inbox commands against a real database behind a proxy
// that goes silent, or refuses, as hosts do: exit 3 and one line each,
// naming the timeout that ran out (the flag's, or the URL's own
// connect_timeout when the flag is not given).
func TestOutages(t *testing.T) {
	t.Parallel()
	url, proxy := pgtest.SchemaBehindFault(t) // its URL carries connect_timeout=1
	inboxRun(t, 0, "migrate", "--database", url)
	inboxRun(t, 0, "stats", "--database", url)

	proxy.Freeze()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"inbox", "stats", "--database", url}, "no answer within 1s (connect_timeout in --database)"},
		{[]string{"inbox", "prune", "--database", url, "--connect-timeout", "200ms"}, "no answer within 200ms (--connect-timeout)"},
	} {
		before := proxy.Accepted()
		r := cli(t, tc.args...)
		r.expect(t, 3, tc.args)
		if !strings.Contains(r.stderr, tc.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Fatalf("idem %s behind a frozen proxy: stderr %q, want one line with %q", strings.Join(tc.args, " "), r.stderr, tc.want)
		}
		if proxy.Accepted() == before {
			t.Fatalf("idem %s: the proxy accepted nothing", strings.Join(tc.args, " "))
		}
	}

	proxy.Restore()
	proxy.Refuse()
	args := []string{"inbox", "window", "show", "--database", url}
	r := cli(t, args...)
	r.expect(t, 3, args)
	if !strings.HasPrefix(r.stderr, "idem inbox window show: connecting to ") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || proxy.Refused() == 0 {
		t.Fatalf("behind a refusing proxy: stderr %q (refused %d)", r.stderr, proxy.Refused())
	}
	proxy.Restore()
	inboxRun(t, 0, "stats", "--database", url)
}

// TestInterrupted: a command stopped by a signal (its context canceled)
// while it waits for a silent server exits 3 saying it was interrupted.
func TestInterrupted(t *testing.T) {
	t.Parallel()
	addr, _, first := silentServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"inbox", "stats", "--connect-timeout", "0", "--database", "postgres://postgres@" + addr + "/test?sslmode=disable"}, &out, &errb)
	}()
	// Cancel once the command is waiting on the server, as a signal would.
	select {
	case code := <-done:
		t.Fatalf("returned %d before connecting: %s", code, errb.String())
	case <-first:
	}
	cancel()
	select {
	case code := <-done:
		if code != 3 || !strings.HasPrefix(errb.String(), "idem inbox stats: interrupted: ") {
			t.Fatalf("exit %d, stderr %q, want 3 and interrupted", code, errb.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("still running a minute after the cancel")
	}
}

// TestHelpHelp: help about help is the top-level help.
func TestHelpHelp(t *testing.T) {
	t.Parallel()
	top := cli(t, "-h")
	for _, args := range [][]string{{"help", "help"}, {"help", "-h"}, {"help", "--help"}} {
		r := cli(t, args...)
		r.expect(t, 0, args)
		if r.stdout != top.stdout || r.stderr != "" {
			t.Errorf("idem %s: stdout %q, stderr %q; want the top-level help on stdout", strings.Join(args, " "), r.stdout, r.stderr)
		}
	}
}

// TestMigrateWindowHelp: migrate's --window is the window of a new table,
// not a prune's.
func TestMigrateWindowHelp(t *testing.T) {
	t.Parallel()
	r := cli(t, "inbox", "migrate", "-h")
	r.expect(t, 0, []string{"inbox", "migrate", "-h"})
	want := "retention window recorded for a new table (an existing table keeps its stored window; change it with: idem inbox window set)"
	if !strings.Contains(r.stdout, want) || strings.Contains(r.stdout, "remove markers by") || strings.Contains(r.stdout, "shorter one is refused") {
		t.Errorf("idem inbox migrate -h describes --window as:\n%s", r.stdout)
	}
	// prune's --window is still the prune's.
	if r := cli(t, "inbox", "prune", "-h"); !strings.Contains(r.stdout, "a shorter one is refused") {
		t.Errorf("idem inbox prune -h lost its --window help:\n%s", r.stdout)
	}
}

// TestCommandsNameTheirDatabase pins that a command that touched a database
// names it on stderr, once, and that a failing one keeps its one error line.
func TestCommandsNameTheirDatabase(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "named.db")
	args := []string{"inbox", "migrate", "--sqlite", file}
	cli(t, args...).expect(t, 0, args)
	args = []string{"inbox", "stats", "--sqlite", file}
	r := cli(t, args...)
	r.expect(t, 0, args)
	if want := "idem inbox stats: database: SQLite " + file + "\n"; r.stderr != want {
		t.Fatalf("stderr %q, want %q", r.stderr, want)
	}
	args = []string{"inbox", "stats", "--sqlite", file, "--json"}
	r = cli(t, args...)
	r.expect(t, 0, args)
	if r.stderr != "" {
		t.Fatalf("--json: stderr %q, want nothing beside the JSON", r.stderr)
	}
}

// TestDeprecatedSpellings pins that an old flag name is still taken, as the
// flag it now spells, and that the help lists only the new one.
func TestDeprecatedSpellings(t *testing.T) {
	t.Parallel()
	// A port that was just closed: the flags parse, and the command fails
	// connecting (exit 3), not on its flags (exit 2).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	args := []string{"audit", "void", "--table", "t", "--key", "k", "--apply", "--why", "refunded", "--by", "ops", "--database", "postgres://postgres@" + addr + "/test?sslmode=disable"}
	cli(t, args...).expect(t, 3, args)
	args = []string{"audit", "void", "--table", "t", "--key", "k", "--apply", "--by", "ops"}
	if r := cli(t, args...); r.code != 2 || !strings.Contains(r.stderr, "--apply needs --reason and --by") {
		t.Fatalf("void without a reason: exit %d, %q", r.code, r.stderr)
	}
	for _, c := range []struct {
		args     []string
		new, old string
	}{
		{[]string{"demo", "-h"}, "--database", "--postgres"},
		{[]string{"demo", "-h"}, "--amqp", "--rabbitmq"},
		{[]string{"demo", "-h"}, "--brokers", "--kafka"},
		{[]string{"audit", "void", "-h"}, "--reason", "--why"},
	} {
		r := cli(t, c.args...)
		r.expect(t, 0, c.args)
		if !strings.Contains(r.stdout, "  "+c.new+" ") || strings.Contains(r.stdout, "  "+c.old+" ") {
			t.Errorf("idem %s: want %s listed and %s not:\n%s", strings.Join(c.args, " "), c.new, c.old, r.stdout)
		}
	}
}
