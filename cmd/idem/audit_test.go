package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
)

// auditSeedSQL: five duplicated invoices out of seven customers, as after a
// broker restart; c-3's copy and c-5's copy were charged. Old enough that
// the source counts as stopped.
const auditSeedSQL = `
CREATE TABLE invoices (
	id                bigserial PRIMARY KEY,
	customer_id       text NOT NULL,
	period            text NOT NULL,
	amount            numeric(14,2) NOT NULL,
	status            text NOT NULL,
	created_at        timestamptz NOT NULL,
	source_message_id text
);
CREATE TABLE x (id int);
INSERT INTO invoices (customer_id, period, amount, status, created_at, source_message_id) VALUES
	('c-1', '2026-03', 100.00, 'Issued', now() - interval '3 days', 'm-1'),
	('c-1', '2026-03', 100.00, 'Issued', now() - interval '3 days' + interval '7 min', 'm-1'),
	('c-2', '2026-03', 200.00, 'Paid',   now() - interval '3 days', 'm-2'),
	('c-2', '2026-03', 200.00, 'Issued', now() - interval '3 days' + interval '7 min', 'm-2'),
	('c-3', '2026-03', 300.00, 'Paid',   now() - interval '3 days', 'm-3'),
	('c-3', '2026-03', 300.00, 'Paid',   now() - interval '3 days' + interval '7 min', 'm-3'),
	('c-4', '2026-03', 400.00, 'Issued', now() - interval '3 days', 'm-4'),
	('c-4', '2026-03', 400.00, 'Issued', now() - interval '3 days' + interval '7 min', 'm-4'),
	('c-4', '2026-03', 400.00, 'Issued', now() - interval '3 days' + interval '9 min', 'm-4'),
	('c-5', '2026-03', 500.00, 'Issued', now() - interval '3 days', 'm-5'),
	('c-5', '2026-03', 500.00, 'Paid',   now() - interval '3 days' + interval '7 min', 'm-5'),
	('c-6', '2026-03', 600.00, 'Paid',   now() - interval '3 days', 'm-6'),
	('c-7', '2026-03', 700.00, 'Issued', now() - interval '3 days', 'm-7');
`

func auditSeed(t *testing.T, extra string) string {
	t.Helper()
	url := auditSchemaURL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, auditSeedSQL+extra); err != nil {
		t.Fatalf("seeding: %v", err)
	}
	return url
}

// auditRun runs idem with args and returns the exit status and output.
func auditRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

var auditSpaces = regexp.MustCompile(`[ \t]+`)

// auditExpect runs idem and checks the exit status and that the output
// holds each of wantOut (runs of spaces compare equal, so column widths do
// not matter).
func auditExpect(t *testing.T, wantCode int, wantOut []string, args ...string) string {
	t.Helper()
	code, out, errb := auditRun(t, args...)
	if code != wantCode {
		t.Fatalf("idem %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args[:2], " "), code, wantCode, out, errb)
	}
	all := auditSpaces.ReplaceAllString(out+errb, " ")
	for _, w := range wantOut {
		if !strings.Contains(all, auditSpaces.ReplaceAllString(w, " ")) {
			t.Fatalf("idem %s: output lacks %q\nstdout:\n%s\nstderr:\n%s", strings.Join(args[:2], " "), w, out, errb)
		}
	}
	return out
}

func TestAuditCLIRepairSession(t *testing.T) {
	t.Parallel()
	db := auditSeed(t, "")
	common := []string{"--database", db, "--table", "invoices", "--key", "customer_id,period"}
	with := func(sub string, more ...string) []string {
		return append(append([]string{"audit", sub}, common...), more...)
	}

	auditExpect(t, 1, []string{"DUPLICATES", "5 duplicate groups, 6 extra rows", "no unique index"}, with("check")...)
	auditExpect(t, 0, []string{
		"duplicate groups: 5", "rows in them:    11  amount 3400.00",
		"extra rows:       6  amount 1900.00", "unpaid:          4  amount 1100.00", "paid:            2  amount 800.00",
		"verdict: not being created any more",
	}, with("duplicates", "--amount", "amount")...)
	auditExpect(t, 1, []string{"duplicate groups remain", "void them first"}, with("guard")...)
	auditExpect(t, 3, []string{"no column voided_reason, voided_by, voided_at, voided_from_status", "--add-columns"}, with("void")...)
	auditExpect(t, 0, []string{"DRY RUN", "rows to void: 4, amount 1100.00", "paid rows skipped: 2, amount 800.00", "columns to add: voided_reason, voided_by, voided_at, voided_from_status"},
		with("void", "--amount", "amount", "--add-columns")...)
	auditExpect(t, 2, []string{"--apply needs --reason and --by"}, with("void", "--apply")...)
	auditExpect(t, 0, []string{"APPLIED", "rows voided: 4", "refund these"},
		with("void", "--apply", "--add-columns", "--reason", "redelivery", "--by", "ops")...)
	auditExpect(t, 0, []string{"... and 1 more (--limit 0 or --json lists all)"},
		with("void", "--add-columns", "--limit", "1")...)
	auditExpect(t, 0, []string{"APPLIED", "rows voided: 0", "paid rows skipped: 2"},
		with("void", "--apply", "--reason", "redelivery", "--by", "ops")...)
	auditExpect(t, 1, []string{"2 groups, 2 extra rows"}, with("guard")...)
	auditExpect(t, 0, []string{"rows voided: 2"},
		with("void", "--apply", "--include-paid", "--reason", "refunded", "--by", "acct")...)
	auditExpect(t, 0, []string{"created index ux_invoices_customer_id_period", "CREATE UNIQUE INDEX CONCURRENTLY"}, with("guard")...)
	auditExpect(t, 0, []string{"already exists"}, with("guard")...)
	auditExpect(t, 0, []string{"OK", "0 duplicate groups", "guarded by ux_invoices_customer_id_period"}, with("check")...)

	// JSON carries the same numbers.
	out := auditExpect(t, 0, nil, with("check", "--json")...)
	var chk struct {
		Groups     int64  `json:"groups"`
		GuardIndex string `json:"guard_index"`
	}
	if err := json.Unmarshal([]byte(out), &chk); err != nil || chk.Groups != 0 || chk.GuardIndex == "" {
		t.Fatalf("check --json %q: %+v %v", out, chk, err)
	}
}

func TestAuditCLIJSONReport(t *testing.T) {
	t.Parallel()
	db := auditSeed(t, "")
	out := auditExpect(t, 0, nil, "audit", "duplicates", "--database", db, "--table", "invoices", "--key", "customer_id,period", "--amount", "amount", "--json", "--limit", "1")
	var rep struct {
		Summary struct {
			Groups          int64  `json:"groups"`
			ExtraRows       int64  `json:"extra_rows"`
			ExtraAmount     string `json:"extra_amount"`
			PaidExtraAmount string `json:"paid_extra_amount"`
			Activity        struct {
				StillBeingCreated bool `json:"still_being_created"`
			} `json:"activity"`
		} `json:"summary"`
		Groups    []json.RawMessage `json:"groups"`
		Truncated bool              `json:"truncated"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	s := rep.Summary
	if s.Groups != 5 || s.ExtraRows != 6 || s.ExtraAmount != "1900.00" || s.PaidExtraAmount != "800.00" || s.Activity.StillBeingCreated || len(rep.Groups) != 1 || !rep.Truncated {
		t.Fatalf("report %+v", rep)
	}
}

func TestAuditCLIRefusesWhileDuplicatesAreCreated(t *testing.T) {
	t.Parallel()
	db := auditSeed(t, `INSERT INTO invoices (customer_id, period, amount, status, created_at) VALUES
		('c-7', '2026-03', 700.00, 'Issued', now() - interval '5 min');`)
	args := []string{"audit", "void", "--database", db, "--table", "invoices", "--key", "customer_id,period", "--add-columns", "--apply", "--reason", "r", "--by", "b"}
	auditExpect(t, 0, []string{"STILL BEING CREATED"}, "audit", "duplicates", "--database", db, "--table", "invoices", "--key", "customer_id,period")
	auditExpect(t, 1, []string{"refused", "duplicates are still being created", "--force"}, args...)
	auditExpect(t, 1, []string{"DRY RUN", "refused"}, "audit", "void", "--database", db, "--table", "invoices", "--key", "customer_id,period", "--add-columns")
	// The report itself says why nothing was written: not a dry run asking
	// for the flags already given, but the quiet period and --force.
	_, out, _ := auditRun(t, args...)
	first, _, _ := strings.Cut(out, "\n")
	if !regexp.MustCompile(`^REFUSED: nothing written: duplicates are still being created \(the newest duplicate row is \d+m\d+s old, inside the --quiet-period of 1h0m0s\); stop the producer and wait out the quiet period, or add --force to void anyway\.$`).MatchString(first) ||
		strings.Contains(out, "DRY RUN") || strings.Contains(out, "add --apply") {
		t.Fatalf("refused void --apply: report starts %q:\n%s", first, out)
	}
	_, out, _ = auditRun(t, "audit", "void", "--database", db, "--table", "invoices", "--key", "customer_id,period", "--add-columns")
	if first, _, _ := strings.Cut(out, "\n"); !strings.HasPrefix(first, "DRY RUN: nothing written; duplicates are still being created") || !strings.Contains(first, "--apply would be refused until the quiet period is over, unless --force") {
		t.Fatalf("dry run while duplicates are created: report starts %q", first)
	}
	// A shorter quiet period, or --force, lets it through.
	auditExpect(t, 0, []string{"rows voided: 5"}, append(args, "--quiet-period", "1m")...)
}

func TestAuditCLIForce(t *testing.T) {
	t.Parallel()
	db := auditSeed(t, `INSERT INTO invoices (customer_id, period, amount, status, created_at) VALUES
		('c-7', '2026-03', 700.00, 'Issued', now());`)
	auditExpect(t, 0, []string{"rows voided: 5", "forced"}, "audit", "void", "--database", db, "--table", "invoices", "--key", "customer_id,period",
		"--add-columns", "--apply", "--reason", "r", "--by", "b", "--force")
}

func TestAuditCLIRefusesHostileNames(t *testing.T) {
	t.Parallel()
	db := auditSeed(t, "")
	hostile := `invoices"; DROP TABLE x;--`
	for _, args := range [][]string{
		{"audit", "duplicates", "--database", db, "--table", hostile, "--key", "customer_id"},
		{"audit", "void", "--database", db, "--table", "invoices", "--key", "customer_id," + hostile},
		{"audit", "void", "--database", db, "--table", "invoices", "--key", "customer_id", "--reason-column", hostile},
		{"audit", "guard", "--database", db, "--table", "invoices", "--key", "customer_id", "--index", hostile},
		{"audit", "guard", "--print", "--table", "invoices", "--key", "customer_id", "--status-column", hostile},
		{"audit", "check", "--database", db, "--table", hostile, "--key", "customer_id"},
	} {
		auditExpect(t, 2, []string{"invalid SQL name", "DROP TABLE x"}, args...)
	}
	auditExpect(t, 2, []string{"--void-value"}, "audit", "guard", "--print", "--table", "invoices", "--key", "customer_id", "--void-value", "x' OR 'a'='a")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT count(*) FROM x"); err != nil {
		t.Fatalf("table x: %v", err)
	}
}

func TestAuditCLIUsage(t *testing.T) {
	t.Parallel()
	auditExpect(t, 2, []string{"unknown subcommand", "idem audit -h"}, "audit", "")
	if code, _, errb := auditRun(t, "audit"); code != 2 || !strings.Contains(errb, "duplicates") {
		t.Fatalf("idem audit: exit %d %s", code, errb)
	}
	auditExpect(t, 2, []string{"unknown subcommand"}, "audit", "dedupe")
	auditExpect(t, 2, []string{"--key is required"}, "audit", "check", "--table", "invoices")
	auditExpect(t, 2, []string{"unknown flag --tabel"}, "audit", "check", "--tabel", "invoices")
	auditExpect(t, 0, []string{"-include-paid"}, "audit", "void", "-h")
	auditExpect(t, 0, []string{`WHERE "status" <> 'VoidedDuplicate';`}, "audit", "guard", "--print", "--table", "billing.invoices", "--key", "customer_id,period")
	// check tells "could not check" (3) from "duplicates found" (1).
	auditExpect(t, 3, []string{"connecting to"}, "audit", "check", "--database", "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", "--table", "invoices", "--key", "customer_id")
	db := auditSeed(t, "")
	auditExpect(t, 3, []string{"no column nope"}, "audit", "check", "--database", db, "--table", "invoices", "--key", "nope")
}

// auditTestDatabase is where these tests make their schemas, rather than the
// shared test database: CREATE INDEX CONCURRENTLY waits for every older
// transaction in its database, and other packages' tests keep that one
// busy (a guard took 90 s there under a parallel make test).
const auditTestDatabase = "idem_audit_test"

// auditSchemaURL makes a fresh schema in auditTestDatabase (see pgtest.SchemaIn).
func auditSchemaURL(t testing.TB) string {
	t.Helper()
	return pgtest.SchemaIn(t, auditTestDatabase)
}

// syncBuffer is a bytes.Buffer safe for the watcher goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestAuditCLICheckEveryServesGauge(t *testing.T) {
	t.Parallel()
	db := auditSeed(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"audit", "check", "--database", db, "--table", "invoices", "--key", "customer_id,period",
			"--every", "6h", "--listen", "127.0.0.1:0"}, &out, &errb)
	}()
	addr := regexp.MustCompile(`metrics on (http://\S+/metrics)`)
	deadline := time.Now().Add(20 * time.Second)
	var url string
	for time.Now().Before(deadline) {
		if m := addr.FindStringSubmatch(errb.String()); m != nil && strings.Contains(out.String(), "DUPLICATES") {
			url = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("check --every exited %d early: %s %s", code, out.String(), errb.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if url == "" {
		t.Fatalf("no first check within 20s: %s %s", out.String(), errb.String())
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`idem_audit_duplicate_groups{key="customer_id,period",table="invoices"} 5`,
		`idem_audit_duplicate_extra_rows{key="customer_id,period",table="invoices"} 6`,
		`idem_audit_guard_index_present{key="customer_id,period",table="invoices"} 0`,
		`idem_audit_check_errors_total{key="customer_id,period",table="invoices"} 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, body)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("check --every exited %d after cancel: %s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("check --every did not stop after cancel")
	}
}

// auditSeedMySQL is auditSeedSQL on MySQL: five duplicated invoices out of
// seven customers, c-3's and c-5's copies charged, three days old.
var auditSeedMySQL = []string{
	`CREATE TABLE invoices (
	id                BIGINT AUTO_INCREMENT PRIMARY KEY,
	customer_id       VARCHAR(64) NOT NULL,
	period            VARCHAR(7) NOT NULL,
	amount            DECIMAL(14,2) NOT NULL,
	status            VARCHAR(32) NOT NULL,
	created_at        DATETIME(6) NOT NULL,
	source_message_id VARCHAR(64)
)`,
	`INSERT INTO invoices (customer_id, period, amount, status, created_at, source_message_id) VALUES
	('c-1', '2026-03', 100.00, 'Issued', UTC_TIMESTAMP(6) - INTERVAL 3 DAY, 'm-1'),
	('c-1', '2026-03', 100.00, 'Issued', UTC_TIMESTAMP(6) - INTERVAL 3 DAY + INTERVAL 7 MINUTE, 'm-1'),
	('c-2', '2026-03', 200.00, 'Paid',   UTC_TIMESTAMP(6) - INTERVAL 3 DAY, 'm-2'),
	('c-2', '2026-03', 200.00, 'Issued', UTC_TIMESTAMP(6) - INTERVAL 3 DAY + INTERVAL 7 MINUTE, 'm-2'),
	('c-3', '2026-03', 300.00, 'Paid',   UTC_TIMESTAMP(6) - INTERVAL 3 DAY, 'm-3'),
	('c-3', '2026-03', 300.00, 'Paid',   UTC_TIMESTAMP(6) - INTERVAL 3 DAY + INTERVAL 7 MINUTE, 'm-3'),
	('c-4', '2026-03', 400.00, 'Issued', UTC_TIMESTAMP(6) - INTERVAL 3 DAY, 'm-4'),
	('c-4', '2026-03', 400.00, 'Issued', UTC_TIMESTAMP(6) - INTERVAL 3 DAY + INTERVAL 7 MINUTE, 'm-4'),
	('c-4', '2026-03', 400.00, 'Issued', UTC_TIMESTAMP(6) - INTERVAL 3 DAY + INTERVAL 9 MINUTE, 'm-4'),
	('c-5', '2026-03', 500.00, 'Issued', UTC_TIMESTAMP(6) - INTERVAL 3 DAY, 'm-5'),
	('c-5', '2026-03', 500.00, 'Paid',   UTC_TIMESTAMP(6) - INTERVAL 3 DAY + INTERVAL 7 MINUTE, 'm-5'),
	('c-6', '2026-03', 600.00, 'Paid',   UTC_TIMESTAMP(6) - INTERVAL 3 DAY, 'm-6'),
	('c-7', '2026-03', 700.00, 'Issued', UTC_TIMESTAMP(6) - INTERVAL 3 DAY, 'm-7')`,
}

// TestAuditCLIMySQL is the repair session of TestAuditCLIRepairSession on
// MariaDB with --mysql: check, duplicates, void (dry run, apply, paid
// rows), guard (the virtual idem_live column and its unique index) and
// check again, with the same numbers as on PostgreSQL.
func TestAuditCLIMySQL(t *testing.T) {
	t.Parallel()
	cfg := mysqltest.Database(t, "idem_cli_")
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range auditSeedMySQL {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("seeding: %v", err)
		}
	}
	common := []string{"--mysql", cfg.FormatDSN(), "--table", "invoices", "--key", "customer_id,period"}
	with := func(sub string, more ...string) []string {
		return append(append([]string{"audit", sub}, common...), more...)
	}
	auditExpect(t, 1, []string{"DUPLICATES", "5 duplicate groups, 6 extra rows", "no unique index"}, with("check")...)
	auditExpect(t, 0, []string{
		"duplicate groups: 5", "rows in them:    11  amount 3400.00",
		"extra rows:       6  amount 1900.00", "unpaid:          4  amount 1100.00", "paid:            2  amount 800.00",
		"verdict: not being created any more",
	}, with("duplicates", "--amount", "amount")...)
	auditExpect(t, 1, []string{"duplicate groups remain", "void them first"}, with("guard")...)
	auditExpect(t, 0, []string{"DRY RUN", "rows to void: 4, amount 1100.00", "paid rows skipped: 2, amount 800.00"},
		with("void", "--amount", "amount", "--add-columns")...)
	auditExpect(t, 0, []string{"APPLIED", "rows voided: 4"},
		with("void", "--apply", "--add-columns", "--reason", "redelivery", "--by", "ops")...)
	auditExpect(t, 0, []string{"rows voided: 2"},
		with("void", "--apply", "--include-paid", "--reason", "refunded", "--by", "acct")...)
	auditExpect(t, 0, []string{"idem_live", "ALGORITHM=INPLACE"}, with("guard", "--print")...)
	auditExpect(t, 0, []string{"created index ux_invoices_customer_id_period"}, with("guard")...)
	auditExpect(t, 0, []string{"OK", "0 duplicate groups", "guarded by ux_invoices_customer_id_period"}, with("check")...)
	var voided int
	if err := db.QueryRow(`SELECT count(*) FROM invoices WHERE status = 'VoidedDuplicate'`).Scan(&voided); err != nil || voided != 6 {
		t.Fatalf("%d voided rows (%v), want 6", voided, err)
	}
	// The index fences the table: a second live invoice is refused.
	if _, err := db.Exec(`INSERT INTO invoices (customer_id, period, amount, status, created_at) VALUES ('c-1', '2026-03', 100, 'Issued', UTC_TIMESTAMP(6))`); err == nil {
		t.Error("a duplicate live invoice was accepted after the guard")
	}

	// Wrong flags are refused before connecting.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"audit", "check", "--mysql", "mysql://root@h/db", "--table", "t", "--key", "k"}, "not a URL"},
		{[]string{"audit", "check", "--mysql", cfg.FormatDSN(), "--database", "postgres://h/db", "--table", "t", "--key", "k"}, "--mysql and --database name two databases"},
		{[]string{"audit", "check", "--database", cfg.FormatDSN(), "--table", "t", "--key", "k"}, "give the DSN with --mysql"},
		{[]string{"audit", "check", "--mysql", cfg.FormatDSN(), "--table", "invoices", "--key", "customer_id", "--id", "-"}, "needs an id column"},
	} {
		auditExpect(t, 2, []string{c.want}, c.args...)
	}
}
