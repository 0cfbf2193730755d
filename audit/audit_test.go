package audit_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/audit"
	"github.com/idemkit/idem/internal/pooltest"
)

// seedSQL is the incident in miniature: invoices for (customer_id, period)
// without a unique constraint, after a redelivery created copies. Amounts
// differ per customer so every total names the rows it came from.
//
//	c-1  two unpaid                         -> void the later
//	c-2  earliest Paid, later unpaid        -> void the later
//	c-3  earliest unpaid, later Paid        -> refund list, not voided
//	c-4  three unpaid, inserted out of time order -> keep the earliest, void two
//	c-5  three: unpaid, Paid, unpaid        -> void the third, refund the second
//	c-6  single row                         -> not a duplicate
//	c-7  a pair already voided by hand      -> not a duplicate
//	c-8  two unpaid, the later 2 minutes ago: the source is still active
const seedSQL = `
CREATE TABLE invoices (
	id                bigserial PRIMARY KEY,
	customer_id       text NOT NULL,
	period            text NOT NULL,
	amount            numeric(14,2) NOT NULL,
	status            text NOT NULL DEFAULT 'Issued',
	created_at        timestamptz NOT NULL,
	source_message_id text
);
INSERT INTO invoices (customer_id, period, amount, status, created_at, source_message_id) VALUES
	('c-1', '2026-03', 100.00, 'Issued', now() - interval '10 days',                     'm-1'),
	('c-1', '2026-03', 100.00, 'Issued', now() - interval '10 days' + interval '458 s', 'm-1'),
	('c-2', '2026-03', 200.00, 'Paid',   now() - interval '10 days',                     'm-2'),
	('c-2', '2026-03', 200.00, 'Issued', now() - interval '10 days' + interval '460 s', 'm-2'),
	('c-3', '2026-03', 300.00, 'Issued', now() - interval '10 days',                     'm-3'),
	('c-3', '2026-03', 300.00, 'Paid',   now() - interval '10 days' + interval '461 s', 'm-3'),
	('c-4', '2026-03', 400.00, 'Issued', now() - interval '10 days' + interval '600 s', 'm-4'),
	('c-4', '2026-03', 400.00, 'Issued', now() - interval '10 days',                     'm-4'),
	('c-4', '2026-03', 400.00, 'Issued', now() - interval '10 days' + interval '300 s', 'm-4'),
	('c-5', '2026-03', 500.00, 'Issued', now() - interval '9 days',                      'm-5'),
	('c-5', '2026-03', 500.00, 'Paid',   now() - interval '9 days' + interval '60 s',   'm-5'),
	('c-5', '2026-03', 500.00, 'Issued', now() - interval '9 days' + interval '120 s',  'm-5'),
	('c-6', '2026-03', 600.00, 'Issued', now() - interval '10 days',                     'm-6'),
	('c-7', '2026-03', 700.00, 'Issued',          now() - interval '20 days',            'm-7'),
	('c-7', '2026-03', 700.00, 'VoidedDuplicate', now() - interval '20 days' + interval '5 s', 'm-7'),
	('c-8', '2026-04', 800.00, 'Issued', now() - interval '30 minutes',                 'm-8'),
	('c-8', '2026-04', 800.00, 'Issued', now() - interval '2 minutes',                  'm-8');
`

func seed(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return seedOf(t, 0)
}

// seedOf is seed on a pool of at most conns connections (0: pgx's default).
func seedOf(t *testing.T, conns int) *pgxpool.Pool {
	t.Helper()
	pool := pooltest.OpenPgx(t, schemaURL(t), conns)
	if _, err := pool.Exec(context.Background(), seedSQL); err != nil {
		t.Fatalf("seeding invoices: %v", err)
	}
	return pool
}

func spec() audit.Spec {
	return audit.Spec{Table: "invoices", Key: []string{"customer_id", "period"}, Amount: "amount"}
}

func newAuditor(t *testing.T, pool *pgxpool.Pool, s audit.Spec) *audit.Auditor {
	t.Helper()
	a, err := audit.New(pool, s)
	if err != nil {
		t.Fatalf("audit.New: %v", err)
	}
	return a
}

func deref(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// ids returns the ids of rows matching where, in id order.
func ids(t *testing.T, pool *pgxpool.Pool, where string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT id::text AS sid FROM invoices WHERE "+where+" ORDER BY id", args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// rowIDs returns the rows' ids in numeric order.
func rowIDs(rows []audit.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	sort.Slice(out, func(i, j int) bool {
		if len(out[i]) != len(out[j]) {
			return len(out[i]) < len(out[j])
		}
		return out[i] < out[j]
	})
	return out
}

// snapshot is every column of every row, for "nothing changed" checks.
func snapshot(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), "SELECT string_agg(i::text, E'\\n' ORDER BY id) FROM invoices i").Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDuplicatesReportIsExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seed(t)
	a := newAuditor(t, pool, spec())
	rep, err := a.Duplicates(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Summary
	got := fmt.Sprintf("groups=%d rows=%d extra=%d amount=%s extra_amount=%s paid=%d paid_extra=%d paid_extra_amount=%s unpaid_extra=%d",
		s.Groups, s.Rows, s.ExtraRows, deref(s.Amount), deref(s.ExtraAmount), s.PaidRows, s.PaidExtraRows, deref(s.PaidExtraAmount), s.UnpaidExtraRows)
	want := "groups=6 rows=14 extra=8 amount=5500.00 extra_amount=3200.00 paid=3 paid_extra=2 paid_extra_amount=800.00 unpaid_extra=6"
	if got != want {
		t.Fatalf("summary\n got %s\nwant %s", got, want)
	}
	if !s.Activity.StillBeingCreated {
		t.Fatalf("c-8's duplicate is 2 minutes old, want still being created; got %s", s.Activity.Verdict())
	}
	if age := s.Activity.Age(); age < 2*time.Minute || age > 3*time.Minute {
		t.Fatalf("newest duplicate age %v, want about 2m", age)
	}
	if !strings.HasPrefix(s.Activity.Verdict(), "STILL BEING CREATED") {
		t.Fatalf("verdict %q", s.Activity.Verdict())
	}
	// Newest first: c-8, then c-5 (9 days), then the 10-day-old ones by
	// their latest row: c-4 (+600 s), c-3 (+461), c-2 (+460), c-1 (+458).
	var order []string
	for _, g := range rep.Groups {
		order = append(order, g.Key[0]+"/"+g.Key[1])
	}
	wantOrder := []string{"c-8/2026-04", "c-5/2026-03", "c-4/2026-03", "c-3/2026-03", "c-2/2026-03", "c-1/2026-03"}
	if !reflect.DeepEqual(order, wantOrder) {
		t.Fatalf("group order %v, want %v", order, wantOrder)
	}
	c4 := rep.Groups[2]
	if c4.Rows != 3 || deref(c4.Amount) != "1200.00" || deref(c4.ExtraAmount) != "800.00" || c4.PaidRows != 0 {
		t.Fatalf("c-4 group %+v", c4)
	}
	// c-4's earliest row is the second one inserted.
	if want := "8"; c4.KeepID != want {
		t.Fatalf("c-4 keeps %s, want the earliest row %s", c4.KeepID, want)
	}
	if c4.Earliest == nil || c4.Latest == nil || c4.Latest.Sub(*c4.Earliest) != 600*time.Second {
		t.Fatalf("c-4 earliest %v latest %v, want 600 s apart", c4.Earliest, c4.Latest)
	}
	c5 := rep.Groups[1]
	if c5.PaidRows != 1 || c5.PaidExtras != 1 {
		t.Fatalf("c-5 group %+v, want one paid extra", c5)
	}
	c2 := rep.Groups[4]
	if c2.PaidRows != 1 || c2.PaidExtras != 0 {
		t.Fatalf("c-2 group %+v: the paid row is the kept one", c2)
	}

	// A limit trims the list, never the totals.
	rep2, err := a.Duplicates(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep2.Groups) != 2 || !rep2.Truncated || rep2.Summary.Groups != 6 {
		t.Fatalf("limit 2: %d groups listed, truncated=%v, summary %d", len(rep2.Groups), rep2.Truncated, rep2.Summary.Groups)
	}
}

func TestQuietPeriodDecidesActivity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seed(t)
	s := spec()
	s.QuietPeriod = time.Minute // c-8's newest duplicate is 2 minutes old
	rep, err := newAuditor(t, pool, s).Duplicates(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Activity.StillBeingCreated {
		t.Fatalf("quiet period 1m, newest duplicate 2m old: want not active, got %s", rep.Summary.Activity.Verdict())
	}
	// Without the active pair the newest duplicate is 9 days old.
	if _, err := pool.Exec(ctx, "DELETE FROM invoices WHERE customer_id = 'c-8'"); err != nil {
		t.Fatal(err)
	}
	rep, err = newAuditor(t, pool, spec()).Duplicates(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	act := rep.Summary.Activity
	if act.StillBeingCreated || act.Age() < 8*24*time.Hour || !strings.HasPrefix(act.Verdict(), "not being created") {
		t.Fatalf("9-day-old duplicates: %s", act.Verdict())
	}
}

// TestRepairSession runs an operator's whole session (check, guard, void,
// guard again) on a pool of pgx's default size and on a pool of one
// connection: no step asks the pool for a second connection while it
// holds one.
func TestRepairSession(t *testing.T) {
	t.Parallel()
	for _, conns := range []int{0, 1} {
		t.Run(fmt.Sprintf("conns=%d", conns), func(t *testing.T) {
			t.Parallel()
			repairSession(t, conns)
		})
	}
}

func repairSession(t *testing.T, conns int) {
	ctx := context.Background()
	pool := seedOf(t, conns)
	a := newAuditor(t, pool, spec())
	before := snapshot(t, pool)
	expectedUnpaid := ids(t, pool, `id IN (2, 4, 7, 9, 12, 17)`)
	expectedPaid := ids(t, pool, `id IN (6, 11)`)

	// check: 6 groups, no index.
	chk, err := a.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if chk.Groups != 6 || chk.ExtraRows != 8 || chk.GuardIndex != "" {
		t.Fatalf("check before: %+v", chk)
	}

	// guard refuses while duplicates remain.
	g, err := a.Guard(ctx, "")
	if !errors.Is(err, audit.ErrViolations) || g.Groups != 6 {
		t.Fatalf("guard before void: %v %+v", err, g)
	}

	// The table has no audit columns yet.
	if _, err := a.Void(ctx, audit.VoidOptions{}); !errors.Is(err, audit.ErrMissingColumns) {
		t.Fatalf("void without audit columns: %v", err)
	}

	// Dry run: lists, refuses because c-8 is still active, writes nothing.
	dry, err := a.Void(ctx, audit.VoidOptions{AddColumns: true})
	if !errors.Is(err, audit.ErrStillBeingCreated) {
		t.Fatalf("dry run with an active source: %v", err)
	}
	if !reflect.DeepEqual(rowIDs(dry.Voided), expectedUnpaid) || !reflect.DeepEqual(rowIDs(dry.Refund), expectedPaid) {
		t.Fatalf("dry run lists void %v refund %v; want %v and %v", rowIDs(dry.Voided), rowIDs(dry.Refund), expectedUnpaid, expectedPaid)
	}
	if dry.Applied || deref(dry.VoidedAmount) != "2400.00" || deref(dry.RefundAmount) != "800.00" || !reflect.DeepEqual(dry.AddedColumns, []string{"voided_reason", "voided_by", "voided_at", "voided_from_status"}) {
		t.Fatalf("dry run %+v", dry)
	}
	// --apply without --force refuses too.
	if _, err := a.Void(ctx, audit.VoidOptions{Apply: true, AddColumns: true, Reason: "r", Actor: "a"}); !errors.Is(err, audit.ErrStillBeingCreated) {
		t.Fatalf("apply with an active source: %v", err)
	}
	// Apply needs a reason and an actor.
	if _, err := a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, AddColumns: true}); !errors.Is(err, audit.ErrInvalidSpec) {
		t.Fatalf("apply without reason: %v", err)
	}
	if after := snapshot(t, pool); after != before {
		t.Fatalf("refused voids changed the table:\n%s\n---\n%s", before, after)
	}

	// Apply (forced: the producer was stopped by the operator).
	const reason = "redelivered after broker restart 2026-03-15"
	res, err := a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, AddColumns: true, Reason: reason, Actor: "ops:lan"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Applied || !reflect.DeepEqual(rowIDs(res.Voided), expectedUnpaid) || !reflect.DeepEqual(rowIDs(res.Refund), expectedPaid) || res.Groups != 6 {
		t.Fatalf("void result %+v", res)
	}
	voided := ids(t, pool, "status = 'VoidedDuplicate' AND voided_reason = $1 AND voided_by = 'ops:lan' AND voided_at IS NOT NULL AND voided_from_status = 'Issued'", reason)
	if !reflect.DeepEqual(voided, expectedUnpaid) {
		t.Fatalf("rows with audit columns %v, want %v", voided, expectedUnpaid)
	}
	// Never deletes; the earliest of each group and every paid row untouched.
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM invoices").Scan(&n); err != nil || n != 17 {
		t.Fatalf("row count %d (%v), want 17", n, err)
	}
	if got := ids(t, pool, "status = 'Paid'"); !reflect.DeepEqual(got, []string{"3", "6", "11"}) {
		t.Fatalf("paid rows %v", got)
	}
	if got := ids(t, pool, "status = 'Issued' AND customer_id IN ('c-1','c-4','c-8')"); !reflect.DeepEqual(got, []string{"1", "8", "16"}) {
		t.Fatalf("kept rows %v, want the earliest of each group", got)
	}
	if got := ids(t, pool, "customer_id = 'c-7' AND voided_at IS NOT NULL"); len(got) != 0 {
		t.Fatalf("the hand-voided c-7 row was touched: %v", got)
	}

	// Second run changes nothing.
	once := snapshot(t, pool)
	res2, err := a.Void(ctx, audit.VoidOptions{Apply: true, AddColumns: true, Reason: reason, Actor: "ops:lan"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res2.Voided) != 0 || len(res2.AddedColumns) != 0 || !reflect.DeepEqual(rowIDs(res2.Refund), expectedPaid) {
		t.Fatalf("second void %+v", res2)
	}
	if twice := snapshot(t, pool); twice != once {
		t.Fatalf("second void changed the table:\n%s\n---\n%s", once, twice)
	}

	// The paid duplicates still block the guard: refund first.
	if _, err := a.Guard(ctx, ""); !errors.Is(err, audit.ErrViolations) {
		t.Fatalf("guard with paid duplicates left: %v", err)
	}
	chk, err = a.Check(ctx)
	if err != nil || chk.Groups != 2 || chk.ExtraRows != 2 {
		t.Fatalf("check after first void: %+v %v", chk, err)
	}

	// After the refunds: void the paid ones too.
	res3, err := a.Void(ctx, audit.VoidOptions{Apply: true, IncludePaid: true, Reason: "refunded REF-9", Actor: "acct:mai"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rowIDs(res3.Voided), expectedPaid) {
		t.Fatalf("include-paid voided %v, want %v", rowIDs(res3.Voided), expectedPaid)
	}
	// A voided row that was paid still says so.
	if got := ids(t, pool, "status = 'VoidedDuplicate' AND voided_from_status = 'Paid' AND voided_by = 'acct:mai'"); !reflect.DeepEqual(got, expectedPaid) {
		t.Fatalf("paid rows voided with their previous status: %v, want %v", got, expectedPaid)
	}

	// Guard builds the index; check is zero and sees it.
	g, err = a.Guard(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if !g.Created || g.Index != "ux_invoices_customer_id_period" || len(g.Warnings) != 0 {
		t.Fatalf("guard %+v", g)
	}
	chk, err = a.Check(ctx)
	if err != nil || chk.Groups != 0 || chk.GuardIndex != "ux_invoices_customer_id_period" {
		t.Fatalf("check after guard: %+v %v", chk, err)
	}
	// Idempotent.
	g, err = a.Guard(ctx, "")
	if err != nil || g.Created || g.Existing == "" {
		t.Fatalf("second guard: %+v %v", g, err)
	}

	// The fence holds: a live copy is refused, a voided one is allowed, so a
	// correct invoice can be re-issued after voiding.
	_, err = pool.Exec(ctx, "INSERT INTO invoices (customer_id, period, amount, created_at) VALUES ('c-1', '2026-03', 100, now())")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" {
		t.Fatalf("inserting a live duplicate after guard: %v", err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO invoices (customer_id, period, amount, status, created_at) VALUES ('c-1', '2026-03', 100, 'VoidedDuplicate', now())"); err != nil {
		t.Fatalf("inserting a voided row after guard: %v", err)
	}

	// Bypass: drop the index and write a duplicate; check sees both.
	if _, err := pool.Exec(ctx, "DROP INDEX ux_invoices_customer_id_period; INSERT INTO invoices (customer_id, period, amount, created_at) VALUES ('c-1', '2026-03', 100, now())"); err != nil {
		t.Fatal(err)
	}
	chk, err = a.Check(ctx)
	if err != nil || chk.Groups != 1 || chk.GuardIndex != "" {
		t.Fatalf("check after bypass: %+v %v", chk, err)
	}
}

func TestGuardDropsInvalidIndexLeftByFailedBuild(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seed(t)
	s := spec()
	s.PaidValues = []string{"NeverPaid"} // void everything
	s.ReasonColumn, s.ActorColumn, s.VoidedAtColumn = "note", "updated_by", "updated_at"
	s.PreviousStatusColumn = "-" // not recorded
	a := newAuditor(t, pool, s)
	ddl, err := a.GuardDDL("ux_inv")
	if err != nil {
		t.Fatal(err)
	}
	want := `CREATE UNIQUE INDEX CONCURRENTLY "ux_inv" ON "invoices" ("customer_id", "period") WHERE "status" <> 'VoidedDuplicate';`
	if ddl != want {
		t.Fatalf("ddl\n got %s\nwant %s", ddl, want)
	}
	// A build by hand fails on the duplicates and leaves an INVALID index.
	if _, err := pool.Exec(ctx, strings.TrimSuffix(ddl, ";")); err == nil {
		t.Fatal("building the index over duplicates succeeded")
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE invoices ADD COLUMN note text, ADD COLUMN updated_by text, ADD COLUMN updated_at timestamptz"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, Reason: "dup", Actor: "t"}); err != nil {
		t.Fatal(err)
	}
	g, err := a.Guard(ctx, "ux_inv")
	if err != nil {
		t.Fatal(err)
	}
	if !g.Created || !g.DroppedInvalid {
		t.Fatalf("guard %+v, want the invalid index dropped and rebuilt", g)
	}
	var valid bool
	if err := pool.QueryRow(ctx, "SELECT indisvalid FROM pg_index WHERE indexrelid = 'ux_inv'::regclass").Scan(&valid); err != nil || !valid {
		t.Fatalf("index valid=%v err=%v", valid, err)
	}
	if got := ids(t, pool, "updated_by = 't' AND note = 'dup'"); len(got) != 8 {
		t.Fatalf("voided with custom audit columns: %v, want 8 rows", got)
	}
}

func TestHostileNamesAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seed(t)
	if _, err := pool.Exec(ctx, "CREATE TABLE x (id int)"); err != nil {
		t.Fatal(err)
	}
	hostile := []audit.Spec{
		{Table: `invoices"; DROP TABLE x;--`, Key: []string{"customer_id"}},
		{Table: "invoices", Key: []string{`customer_id"; DROP TABLE x;--`}},
		{Table: "invoices", Key: []string{"customer_id"}, Time: "created_at) ; DROP TABLE x"},
		{Table: "invoices", Key: []string{"customer_id"}, Amount: "amount/*"},
		{Table: "invoices", Key: []string{"customer_id"}, Status: "status'"},
		{Table: "invoices", Key: []string{"customer_id"}, ReasonColumn: "r; DELETE FROM invoices"},
		{Table: "a.b.c", Key: []string{"customer_id"}},
		{Table: "invoices", Key: []string{"public.customer_id"}},
		{Table: "invoices", Key: []string{"customer id"}},
	}
	for _, s := range hostile {
		if _, err := audit.New(pool, s); !errors.Is(err, audit.ErrInvalidName) {
			t.Errorf("spec %+v: err %v, want ErrInvalidName", s, err)
		}
	}
	// The void value lands in DDL, so it is held to a safe alphabet.
	if _, err := audit.New(pool, audit.Spec{Table: "invoices", Key: []string{"customer_id"}, VoidValue: "x' OR '1'='1"}); !errors.Is(err, audit.ErrInvalidSpec) {
		t.Errorf("hostile void value: %v", err)
	}
	// Paid values are bind parameters: any text is harmless.
	a := newAuditor(t, pool, audit.Spec{Table: "invoices", Key: []string{"customer_id", "period"}, PaidValues: []string{"'); DROP TABLE x;--"}})
	rep, err := a.Duplicates(ctx, 0)
	if err != nil || rep.Summary.PaidRows != 0 {
		t.Fatalf("hostile paid value: %+v %v", rep, err)
	}
	// A bad index name for the guard.
	a = newAuditor(t, pool, spec())
	if _, err := a.GuardDDL(`ix"; DROP TABLE x;--`); !errors.Is(err, audit.ErrInvalidName) {
		t.Errorf("hostile index name: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM x").Scan(&n); err != nil {
		t.Fatalf("table x is gone: %v", err)
	}
}

func TestNamesAreCheckedAgainstTheCatalog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seed(t)
	for _, s := range []audit.Spec{
		{Table: "invoice", Key: []string{"customer_id"}},
		{Table: "Invoices", Key: []string{"customer_id"}},
		{Table: "invoices", Key: []string{"customer"}},
		{Table: "invoices", Key: []string{"customer_id"}, Amount: "total"},
	} {
		_, err := newAuditor(t, pool, s).Duplicates(ctx, 0)
		if !errors.Is(err, audit.ErrNotFound) {
			t.Errorf("spec %+v: %v, want ErrNotFound", s, err)
		}
	}
}

func TestSchemaQualifiedTableAndEnumStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seed(t)
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	// An enum status column and a table reached through its schema.
	if _, err := pool.Exec(ctx, `
		CREATE TYPE invoice_status AS ENUM ('Issued', 'Paid', 'VoidedDuplicate');
		ALTER TABLE invoices ALTER COLUMN status DROP DEFAULT,
			ALTER COLUMN status TYPE invoice_status USING status::invoice_status`); err != nil {
		t.Fatal(err)
	}
	s := spec()
	s.Table = schema + ".invoices"
	a := newAuditor(t, pool, s)
	res, err := a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, IncludePaid: true, AddColumns: true, Reason: "dup", Actor: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Voided) != 8 {
		t.Fatalf("voided %d rows, want 8", len(res.Voided))
	}
	if _, err := a.Guard(ctx, ""); err != nil {
		t.Fatal(err)
	}
	chk, err := a.Check(ctx)
	if err != nil || chk.Groups != 0 || chk.GuardIndex == "" {
		t.Fatalf("check: %+v %v", chk, err)
	}
}

func TestVoidWritesNothingWhenARowChangesUnderIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := seed(t)
	a := newAuditor(t, pool, spec())
	if _, err := pool.Exec(ctx, "ALTER TABLE invoices ADD COLUMN voided_reason text, ADD COLUMN voided_by text, ADD COLUMN voided_at timestamptz, ADD COLUMN voided_from_status text"); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, pool)
	// Another transaction holds row 2 (a row the void will mark) and
	// changes it: the payment for it lands while the void runs.
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if _, err := other.Exec(ctx, "UPDATE invoices SET status = 'Paid' WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	var otherPID int
	if err := other.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&otherPID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, Reason: "r", Actor: "a", LockTimeout: time.Minute})
		done <- err
	}()
	// Wait until the void is blocked on the row lock, then commit.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", otherPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the void never waited for the row lock")
		}
		select {
		case err := <-done:
			t.Fatalf("void finished before the competing commit: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, audit.ErrConcurrentChange) {
		t.Fatalf("void over a concurrently paid row: %v, want ErrConcurrentChange", err)
	}
	// Nothing was voided; only the competing payment landed.
	after := snapshot(t, pool)
	if got := ids(t, pool, "status = 'VoidedDuplicate' AND voided_at IS NOT NULL"); len(got) != 0 {
		t.Fatalf("rows voided despite the failure: %v", got)
	}
	if before == after {
		t.Fatal("the competing update did not land")
	}
	// Run again: the row is now a paid extra and is skipped.
	res, err := a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, Reason: "r", Actor: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := rowIDs(res.Refund); !reflect.DeepEqual(got, []string{"2", "6", "11"}) {
		t.Fatalf("refund list after the payment landed: %v", got)
	}
}

func FuzzParseIdent(f *testing.F) {
	for _, s := range []string{"invoices", "billing.invoices", `invoices"; DROP TABLE x;--`, "a.b.c", "", "Ünï", "x$1", "_", "a..b", `"q"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := audit.ParseIdent(s, true)
		if err != nil {
			if !errors.Is(err, audit.ErrInvalidName) {
				t.Fatalf("ParseIdent(%q): error %v does not wrap ErrInvalidName", s, err)
			}
			return
		}
		if id.String() != s {
			t.Fatalf("ParseIdent(%q) round-trips to %q", s, id.String())
		}
		for _, r := range s {
			if !(r == '.' || r == '_' || r == '$' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				t.Fatalf("ParseIdent(%q) accepted %q", s, r)
			}
		}
	})
}
