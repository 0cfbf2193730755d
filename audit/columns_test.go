package audit_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/audit"
)

// bareSQL is a table as many are: no status column and no id column, only
// the business key, a time and an amount. c-1 has two rows, c-2 three (one
// inserted out of time order), c-3 one; a row with a NULL key counts for
// nothing, as a unique index would not constrain it.
const bareSQL = `
CREATE TABLE ledger (
	customer_id text,
	period      text NOT NULL,
	amount      numeric(14,2) NOT NULL,
	created_at  timestamptz NOT NULL
);
INSERT INTO ledger VALUES
	('c-1', '2026-03', 100.00, now() - interval '10 days'),
	('c-1', '2026-03', 100.00, now() - interval '10 days' + interval '7 min'),
	('c-2', '2026-03', 200.00, now() - interval '9 days' + interval '5 min'),
	('c-2', '2026-03', 200.00, now() - interval '9 days'),
	('c-2', '2026-03', 200.00, now() - interval '9 days' + interval '9 min'),
	('c-3', '2026-03', 300.00, now() - interval '8 days'),
	(NULL,  '2026-03', 400.00, now() - interval '8 days'),
	(NULL,  '2026-03', 400.00, now() - interval '8 days');
`

func seedBare(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testPool(t)
	if _, err := pool.Exec(context.Background(), bareSQL); err != nil {
		t.Fatalf("seeding ledger: %v", err)
	}
	return pool
}

func bareSpec() audit.Spec {
	return audit.Spec{Table: "ledger", Key: []string{"customer_id", "period"}, Amount: "amount",
		Status: audit.NoColumn, ID: audit.NoColumn}
}

// earliestCtid is the physical address of the earliest row of a customer.
func earliestCtid(t *testing.T, pool *pgxpool.Pool, customer string) string {
	t.Helper()
	var ctid string
	if err := pool.QueryRow(context.Background(),
		`SELECT ctid::text FROM ledger WHERE customer_id = $1 ORDER BY created_at LIMIT 1`, customer).Scan(&ctid); err != nil {
		t.Fatal(err)
	}
	return ctid
}

// TestNoStatusNoIDDuplicates: without a status column every row is live;
// without an id the kept row is named by its physical address, and it is
// the earliest row of its key.
func TestNoStatusNoIDDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seedBare(t)
	a := newAuditor(t, pool, bareSpec())
	rep, err := a.Duplicates(ctx, 0)
	if err != nil {
		t.Fatalf("Duplicates: %v", err)
	}
	s := rep.Summary
	if s.Groups != 2 || s.Rows != 5 || s.ExtraRows != 3 || deref(s.ExtraAmount) != "500.00" || s.PaidRows != 0 {
		t.Fatalf("summary %+v (extra amount %s), want 2 groups, 5 rows, 3 extra worth 500.00, none paid", s, deref(s.ExtraAmount))
	}
	keep := map[string]string{}
	for _, g := range rep.Groups {
		keep[g.Key[0]] = g.KeepID
	}
	for _, c := range []string{"c-1", "c-2"} {
		if want := earliestCtid(t, pool, c); keep[c] != want {
			t.Fatalf("group %s keeps %q, want the earliest row %s (groups %+v)", c, keep[c], want, rep.Groups)
		}
	}
	res, err := a.Check(ctx)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if res.Groups != 2 || res.ExtraRows != 3 || res.GuardIndex != "" {
		t.Fatalf("check %+v, want 2 groups, 3 extra rows, no guard", res)
	}
}

// TestNoStatusGuardIsPlainUniqueIndex: the guard of a table without a status
// column is a unique index over the whole table, refused while duplicates
// remain, and once built it turns a duplicate insert away.
func TestNoStatusGuardIsPlainUniqueIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seedBare(t)
	a := newAuditor(t, pool, bareSpec())
	ddl, err := a.GuardDDL("")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ddl, "WHERE") || !strings.Contains(ddl, `ON "ledger" ("customer_id", "period")`) {
		t.Fatalf("guard DDL %q, want a plain unique index on the key", ddl)
	}
	if _, err := a.Guard(ctx, ""); !errors.Is(err, audit.ErrViolations) {
		t.Fatalf("Guard with duplicates: %v, want ErrViolations", err)
	}
	// Remove the extras by hand (no status: there is nothing to void with).
	if _, err := pool.Exec(ctx, `DELETE FROM ledger l USING ledger e
WHERE l.customer_id = e.customer_id AND l.period = e.period AND l.created_at > e.created_at`); err != nil {
		t.Fatal(err)
	}
	res, err := a.Guard(ctx, "")
	if err != nil {
		t.Fatalf("Guard: %v", err)
	}
	if !res.Created || len(res.Warnings) != 0 {
		t.Fatalf("guard %+v, want created without warnings", res)
	}
	var def string
	if err := pool.QueryRow(ctx, `SELECT pg_get_indexdef(to_regclass($1))`, res.Index).Scan(&def); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(def, "CREATE UNIQUE INDEX") || strings.Contains(def, "WHERE") {
		t.Fatalf("index %s, want a plain unique index", def)
	}
	_, err = pool.Exec(ctx, `INSERT INTO ledger VALUES ('c-3', '2026-03', 300.00, now())`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" {
		t.Fatalf("duplicate insert after the guard: %v, want a unique violation", err)
	}
	chk, err := a.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if chk.Groups != 0 || chk.GuardIndex != res.Index {
		t.Fatalf("check after the guard %+v, want 0 groups guarded by %s", chk, res.Index)
	}
}

// TestNoIDKeepsStatus: a table with a status but no id still leaves voided
// rows out, and names rows by their address.
func TestNoIDKeepsStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seed(t)
	if _, err := pool.Exec(ctx, `ALTER TABLE invoices DROP COLUMN id`); err != nil {
		t.Fatal(err)
	}
	s := spec()
	s.ID = audit.NoColumn
	a := newAuditor(t, pool, s)
	full, err := newAuditor(t, seed(t), spec()).Duplicates(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := a.Duplicates(ctx, 0)
	if err != nil {
		t.Fatalf("Duplicates without id: %v", err)
	}
	if rep.Summary.Groups != full.Summary.Groups || rep.Summary.ExtraRows != full.Summary.ExtraRows ||
		deref(rep.Summary.ExtraAmount) != deref(full.Summary.ExtraAmount) || rep.Summary.PaidRows != full.Summary.PaidRows {
		t.Fatalf("without id %+v, with id %+v: the same rows must count", rep.Summary, full.Summary)
	}
	for _, g := range rep.Groups {
		if !strings.HasPrefix(g.KeepID, "(") {
			t.Fatalf("group %v keeps %q, want a row address", g.Key, g.KeepID)
		}
	}
	if _, err := a.Void(ctx, audit.VoidOptions{}); !errors.Is(err, audit.ErrInvalidSpec) || !strings.Contains(err.Error(), "id column") {
		t.Fatalf("Void without id: %v, want it refused naming the id column", err)
	}
}

// TestNoStatusVoidRefused: with no status column there is nothing to mark a
// row voided with.
func TestNoStatusVoidRefused(t *testing.T) {
	t.Parallel()
	pool := seedBare(t)
	s := bareSpec()
	s.ID = "" // the default, which ledger lacks: the refusal comes first
	a := newAuditor(t, pool, s)
	if _, err := a.Void(context.Background(), audit.VoidOptions{}); !errors.Is(err, audit.ErrInvalidSpec) || !strings.Contains(err.Error(), "status column") {
		t.Fatalf("Void without status: %v, want it refused naming the status column", err)
	}
}
