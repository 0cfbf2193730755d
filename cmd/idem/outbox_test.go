package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// outboxRun runs idem outbox with args and fails the test unless it exits
// with want.
func outboxRun(t *testing.T, want int, args ...string) (stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	if code := run(ctx, append([]string{"outbox"}, args...), &out, &errb); code != want {
		t.Fatalf("idem outbox %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

// The operator's round on SQLite: migrate, stats with a parked row and
// its reason, retry it, prune the old sent rows.
func TestOutboxCommandsSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "billing.db")
	out, _ := outboxRun(t, 0, "migrate", "--sqlite", file, "--shards", "4")
	if !strings.Contains(out, "created outbox table idem_outbox") || !strings.Contains(out, "4 shards") {
		t.Fatalf("migrate said %q", out)
	}
	out, _ = outboxRun(t, 0, "migrate", "--sqlite", file)
	if !strings.Contains(out, "up to date") {
		t.Fatalf("second migrate said %q", out)
	}

	db, err := sqliteinbox.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	o, err := outbox.NewSQL(db, sqlinbox.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := o.Enqueue(ctx, tx,
		outbox.Message{Destination: "billing.invoices", Key: "c1", Body: []byte("1")},
		outbox.Message{Destination: "billing.invoices", Key: "c2", Body: []byte("2")},
		outbox.Message{Destination: "ledger", Key: "c3", Body: []byte("3")},
		outbox.Message{Destination: "ledger", Key: "c4", Body: []byte("4")},
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// What a relay leaves: one row parked, one sent long ago, one sent now.
	for q, id := range map[string]string{
		`UPDATE idem_outbox SET parked_at = enqueued_at, attempts = 5, parked_reason = 'NO_ROUTE: exchange billing.invoices has no binding' WHERE id = ?`: ids[1],
		`UPDATE idem_outbox SET sent_at = strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', '-8 days') WHERE id = ?`:                                               ids[2],
		`UPDATE idem_outbox SET sent_at = enqueued_at WHERE id = ?`:                                                                                       ids[3],
	} {
		if _, err := db.ExecContext(ctx, q, id); err != nil {
			t.Fatal(err)
		}
	}

	out, _ = outboxRun(t, 0, "stats", "--sqlite", file, "--json")
	var st struct {
		Unsent, Parked, Sent int
		Destinations         []struct {
			Destination          string
			Unsent, Parked, Sent int
		}
		ParkedRows []struct{ ID, Reason string } `json:"parked_rows"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("stats --json printed %q: %v", out, err)
	}
	if st.Unsent != 1 || st.Parked != 1 || st.Sent != 2 || len(st.Destinations) != 2 || st.Destinations[0].Parked != 1 || st.Destinations[1].Sent != 2 {
		t.Fatalf("stats %+v", st)
	}
	if len(st.ParkedRows) != 1 || st.ParkedRows[0].ID != ids[1] || !strings.Contains(st.ParkedRows[0].Reason, "NO_ROUTE") {
		t.Fatalf("parked rows %+v", st.ParkedRows)
	}
	out, _ = outboxRun(t, 0, "stats", "--sqlite", file)
	for _, want := range []string{"unsent         1", "parked         1", "billing.invoices", ids[1], "no binding"} {
		if !strings.Contains(out, want) {
			t.Fatalf("stats printed no %q:\n%s", want, out)
		}
	}

	_, errOut := outboxRun(t, 2, "retry", "--sqlite", file)
	if !strings.Contains(errOut, "--all") {
		t.Fatalf("retry without a selection said %q", errOut)
	}
	out, _ = outboxRun(t, 0, "retry", "--sqlite", file, "--key", "nobody")
	if !strings.Contains(out, "nothing to retry") {
		t.Fatalf("retry of no row said %q", out)
	}
	out, _ = outboxRun(t, 0, "retry", "--sqlite", file, "--id", ids[1], "--json")
	if !strings.Contains(out, `"retried":1`) {
		t.Fatalf("retry said %q", out)
	}

	out, _ = outboxRun(t, 0, "prune", "--sqlite", file, "--dry-run")
	if !strings.Contains(out, "would delete (dry run) 1 rows") {
		t.Fatalf("prune --dry-run said %q", out)
	}
	out, _ = outboxRun(t, 0, "prune", "--sqlite", file, "--json")
	if !strings.Contains(out, `"deleted":1`) {
		t.Fatalf("prune said %q", out)
	}
	var left, parked int
	if err := db.QueryRowContext(ctx, `SELECT count(*), count(parked_at) FROM idem_outbox`).Scan(&left, &parked); err != nil {
		t.Fatal(err)
	}
	if left != 3 || parked != 0 {
		t.Fatalf("%d rows left, %d parked; want 3 and none parked", left, parked)
	}
}

// On PostgreSQL: a table never migrated is named with the command that
// creates it (exit 3, also as JSON); then the commands work.
func TestOutboxCommandsPostgres(t *testing.T) {
	t.Parallel()
	url := pgtest.Schema(t)
	_, errOut := outboxRun(t, 3, "stats", "--database", url, "--table", "events_outbox")
	if !strings.Contains(errOut, "idem outbox migrate --table events_outbox") {
		t.Fatalf("stats of a missing table said %q", errOut)
	}
	out, _ := outboxRun(t, 3, "prune", "--database", url, "--table", "events_outbox", "--json")
	var e struct {
		Error string
		Exit  int
	}
	if err := json.Unmarshal([]byte(out), &e); err != nil || e.Exit != 3 || !strings.Contains(e.Error, "does not exist") {
		t.Fatalf("prune --json of a missing table printed %q (%v)", out, err)
	}
	outboxRun(t, 0, "migrate", "--database", url, "--table", "events_outbox")
	out, _ = outboxRun(t, 0, "stats", "--database", url, "--table", "events_outbox", "--json")
	if !strings.Contains(out, `"unsent":0`) {
		t.Fatalf("stats said %q", out)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var shards int
	if err := db.QueryRow(`SELECT shards FROM events_outbox_meta`).Scan(&shards); err != nil || shards != outbox.DefaultShards {
		t.Fatalf("stored shards %d, %v", shards, err)
	}
}

// Help goes to stdout with exit 0; mistakes are usage errors (exit 2).
func TestOutboxCommandsHelpAndUsage(t *testing.T) {
	t.Parallel()
	out, _ := outboxRun(t, 0, "-h")
	if !strings.Contains(out, "usage: idem outbox <stats|retry|prune|migrate>") {
		t.Fatalf("help %q", out)
	}
	for _, sub := range []string{"stats", "retry", "prune", "migrate"} {
		out, _ := outboxRun(t, 0, sub, "--help")
		if !strings.Contains(out, "usage: idem outbox "+sub) || !strings.Contains(out, "--connect-timeout") {
			t.Fatalf("%s --help: %q", sub, out)
		}
	}
	outboxRun(t, 2)
	outboxRun(t, 2, "resend")
	outboxRun(t, 2, "prune", "--retention", "0s")
	outboxRun(t, 2, "prune", "--batch", "0")
	outboxRun(t, 2, "retry", "--all", "--key", "k")
	outboxRun(t, 2, "stats", "--sqlite", "x.db", "--database", "postgres://x")
	outboxRun(t, 2, "stats", "--sqlite", "x.db", "--table", "s.t")
	_, errOut := outboxRun(t, 3, "stats", "--sqlite", filepath.Join(t.TempDir(), "missing.db"))
	if !strings.Contains(errOut, "does not exist") || !strings.Contains(errOut, "idem outbox migrate") {
		t.Fatalf("stats of a missing file said %q", errOut)
	}
}
