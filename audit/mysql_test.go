package audit_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/audit"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pooltest"
	"github.com/idemkit/idem/mysqlinbox"
)

// mysqlDB opens a fresh database on the server IDEM_MYSQL_URL names
// (mysqltest), dropped when t ends.
func mysqlDB(t *testing.T) *sql.DB {
	t.Helper()
	cfg := mysqltest.Database(t, "idem_audit_")
	cfg.MultiStatements = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// mysqlSeedSQL is seedSQL for MySQL: the same rows, ids and times (in
// UTC, as DATETIME).
const mysqlSeedSQL = `
CREATE TABLE invoices (
	id                bigint AUTO_INCREMENT PRIMARY KEY,
	customer_id       varchar(20) NOT NULL,
	period            varchar(7) NOT NULL,
	amount            decimal(14,2) NOT NULL,
	status            varchar(30) NOT NULL DEFAULT 'Issued',
	created_at        datetime(6) NOT NULL,
	source_message_id varchar(20)
) ENGINE=InnoDB;
SET @now = UTC_TIMESTAMP(6);
INSERT INTO invoices (customer_id, period, amount, status, created_at, source_message_id) VALUES
	('c-1', '2026-03', 100.00, 'Issued', @now - INTERVAL 10 DAY,                     'm-1'),
	('c-1', '2026-03', 100.00, 'Issued', @now - INTERVAL 10 DAY + INTERVAL 458 SECOND, 'm-1'),
	('c-2', '2026-03', 200.00, 'Paid',   @now - INTERVAL 10 DAY,                     'm-2'),
	('c-2', '2026-03', 200.00, 'Issued', @now - INTERVAL 10 DAY + INTERVAL 460 SECOND, 'm-2'),
	('c-3', '2026-03', 300.00, 'Issued', @now - INTERVAL 10 DAY,                     'm-3'),
	('c-3', '2026-03', 300.00, 'Paid',   @now - INTERVAL 10 DAY + INTERVAL 461 SECOND, 'm-3'),
	('c-4', '2026-03', 400.00, 'Issued', @now - INTERVAL 10 DAY + INTERVAL 600 SECOND, 'm-4'),
	('c-4', '2026-03', 400.00, 'Issued', @now - INTERVAL 10 DAY,                     'm-4'),
	('c-4', '2026-03', 400.00, 'Issued', @now - INTERVAL 10 DAY + INTERVAL 300 SECOND, 'm-4'),
	('c-5', '2026-03', 500.00, 'Issued', @now - INTERVAL 9 DAY,                      'm-5'),
	('c-5', '2026-03', 500.00, 'Paid',   @now - INTERVAL 9 DAY + INTERVAL 60 SECOND,   'm-5'),
	('c-5', '2026-03', 500.00, 'Issued', @now - INTERVAL 9 DAY + INTERVAL 120 SECOND,  'm-5'),
	('c-6', '2026-03', 600.00, 'Issued', @now - INTERVAL 10 DAY,                     'm-6'),
	('c-7', '2026-03', 700.00, 'Issued',          @now - INTERVAL 20 DAY,            'm-7'),
	('c-7', '2026-03', 700.00, 'VoidedDuplicate', @now - INTERVAL 20 DAY + INTERVAL 5 SECOND, 'm-7'),
	('c-8', '2026-04', 800.00, 'Issued', @now - INTERVAL 30 MINUTE,                 'm-8'),
	('c-8', '2026-04', 800.00, 'Issued', @now - INTERVAL 2 MINUTE,                  'm-8');
`

func mysqlSeed(t *testing.T) *sql.DB {
	t.Helper()
	db := mysqlDB(t)
	if _, err := db.Exec(mysqlSeedSQL); err != nil {
		t.Fatalf("seeding invoices: %v", err)
	}
	return db
}

func newMySQLAuditor(t *testing.T, db *sql.DB, s audit.Spec) *audit.Auditor {
	t.Helper()
	a, err := audit.NewMySQL(db, s)
	if err != nil {
		t.Fatalf("audit.NewMySQL: %v", err)
	}
	return a
}

func mysqlIDs(t *testing.T, db *sql.DB, where string, args ...any) []string {
	t.Helper()
	rows, err := db.Query("SELECT CAST(id AS CHAR) FROM invoices WHERE "+where+" ORDER BY id", args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func mysqlSnapshot(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query("SELECT * FROM invoices ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var b strings.Builder
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			fmt.Fprintf(&b, "%q ", v)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func TestMySQLDuplicatesReportIsExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqlSeed(t)
	a := newMySQLAuditor(t, db, spec())
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
		t.Fatalf("newest duplicate age %v, want about 2m (times read as UTC)", age)
	}
	var order []string
	for _, g := range rep.Groups {
		order = append(order, g.Key[0]+"/"+g.Key[1])
	}
	wantOrder := []string{"c-8/2026-04", "c-5/2026-03", "c-4/2026-03", "c-3/2026-03", "c-2/2026-03", "c-1/2026-03"}
	if !reflect.DeepEqual(order, wantOrder) {
		t.Fatalf("group order %v, want %v", order, wantOrder)
	}
	c4 := rep.Groups[2]
	if c4.Rows != 3 || deref(c4.Amount) != "1200.00" || deref(c4.ExtraAmount) != "800.00" || c4.PaidRows != 0 || c4.KeepID != "8" {
		t.Fatalf("c-4 group %+v", c4)
	}
	if c4.Earliest == nil || c4.Latest == nil || c4.Latest.Sub(*c4.Earliest) != 600*time.Second {
		t.Fatalf("c-4 earliest %v latest %v, want 600 s apart", c4.Earliest, c4.Latest)
	}
	if c5 := rep.Groups[1]; c5.PaidRows != 1 || c5.PaidExtras != 1 {
		t.Fatalf("c-5 group %+v, want one paid extra", c5)
	}
	rep2, err := a.Duplicates(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep2.Groups) != 2 || !rep2.Truncated || rep2.Summary.Groups != 6 {
		t.Fatalf("limit 2: %d groups listed, truncated=%v, summary %d", len(rep2.Groups), rep2.Truncated, rep2.Summary.Groups)
	}
	// The session settings the audit made do not leak into the pool.
	var tz string
	for range 4 {
		if err := db.QueryRow("SELECT @@session.time_zone").Scan(&tz); err != nil || tz == "+00:00" {
			t.Fatalf("pooled connection time_zone %q (%v)", tz, err)
		}
	}
}

// TestMySQLRepairSession is TestRepairSession on MySQL, on a pool of
// database/sql's default size and with SetMaxOpenConns(1).
func TestMySQLRepairSession(t *testing.T) {
	t.Parallel()
	for _, conns := range []int{0, 1} {
		t.Run(fmt.Sprintf("conns=%d", conns), func(t *testing.T) {
			t.Parallel()
			mysqlRepairSession(t, conns)
		})
	}
}

func mysqlRepairSession(t *testing.T, conns int) {
	ctx := context.Background()
	db := mysqlSeed(t)
	pooltest.SQL(t, db, conns)
	a := newMySQLAuditor(t, db, spec())
	before := mysqlSnapshot(t, db)
	expectedUnpaid := []string{"2", "4", "7", "9", "12", "17"}
	expectedPaid := []string{"6", "11"}

	chk, err := a.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if chk.Groups != 6 || chk.ExtraRows != 8 || chk.GuardIndex != "" {
		t.Fatalf("check before: %+v", chk)
	}
	if g, err := a.Guard(ctx, ""); !errors.Is(err, audit.ErrViolations) || g.Groups != 6 {
		t.Fatalf("guard before void: %v %+v", err, g)
	}
	if _, err := a.Void(ctx, audit.VoidOptions{}); !errors.Is(err, audit.ErrMissingColumns) {
		t.Fatalf("void without audit columns: %v", err)
	}
	dry, err := a.Void(ctx, audit.VoidOptions{AddColumns: true})
	if !errors.Is(err, audit.ErrStillBeingCreated) {
		t.Fatalf("dry run with an active source: %v", err)
	}
	if !reflect.DeepEqual(rowIDs(dry.Voided), expectedUnpaid) || !reflect.DeepEqual(rowIDs(dry.Refund), expectedPaid) {
		t.Fatalf("dry run lists void %v refund %v", rowIDs(dry.Voided), rowIDs(dry.Refund))
	}
	if dry.Applied || deref(dry.VoidedAmount) != "2400.00" || deref(dry.RefundAmount) != "800.00" {
		t.Fatalf("dry run %+v", dry)
	}
	if _, err := a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, AddColumns: true}); !errors.Is(err, audit.ErrInvalidSpec) {
		t.Fatalf("apply without reason: %v", err)
	}
	if after := mysqlSnapshot(t, db); after != before {
		t.Fatalf("refused voids changed the table:\n%s\n---\n%s", before, after)
	}

	const reason = "redelivered after broker restart 2026-03-15"
	res, err := a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, AddColumns: true, Reason: reason, Actor: "ops:lan"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Applied || !reflect.DeepEqual(rowIDs(res.Voided), expectedUnpaid) || !reflect.DeepEqual(rowIDs(res.Refund), expectedPaid) || res.Groups != 6 ||
		!reflect.DeepEqual(res.AddedColumns, []string{"voided_reason", "voided_by", "voided_at", "voided_from_status"}) {
		t.Fatalf("void result %+v", res)
	}
	voided := mysqlIDs(t, db, "status = 'VoidedDuplicate' AND voided_reason = ? AND voided_by = 'ops:lan' AND voided_at > UTC_TIMESTAMP() - INTERVAL 5 MINUTE AND voided_from_status = 'Issued'", reason)
	if !reflect.DeepEqual(voided, expectedUnpaid) {
		t.Fatalf("rows with audit columns %v, want %v", voided, expectedUnpaid)
	}
	if got := mysqlIDs(t, db, "1"); len(got) != 17 {
		t.Fatalf("row count %d, want 17", len(got))
	}
	if got := mysqlIDs(t, db, "status = 'Issued' AND customer_id IN ('c-1','c-4','c-8')"); !reflect.DeepEqual(got, []string{"1", "8", "16"}) {
		t.Fatalf("kept rows %v, want the earliest of each group", got)
	}
	if got := mysqlIDs(t, db, "customer_id = 'c-7' AND voided_at IS NOT NULL"); len(got) != 0 {
		t.Fatalf("the hand-voided c-7 row was touched: %v", got)
	}

	once := mysqlSnapshot(t, db)
	res2, err := a.Void(ctx, audit.VoidOptions{Apply: true, AddColumns: true, Reason: reason, Actor: "ops:lan"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res2.Voided) != 0 || len(res2.AddedColumns) != 0 || !reflect.DeepEqual(rowIDs(res2.Refund), expectedPaid) {
		t.Fatalf("second void %+v", res2)
	}
	if twice := mysqlSnapshot(t, db); twice != once {
		t.Fatalf("second void changed the table:\n%s\n---\n%s", once, twice)
	}
	if _, err := a.Guard(ctx, ""); !errors.Is(err, audit.ErrViolations) {
		t.Fatalf("guard with paid duplicates left: %v", err)
	}

	res3, err := a.Void(ctx, audit.VoidOptions{Apply: true, IncludePaid: true, Reason: "refunded REF-9", Actor: "acct:mai"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rowIDs(res3.Voided), expectedPaid) {
		t.Fatalf("include-paid voided %v, want %v", rowIDs(res3.Voided), expectedPaid)
	}
	if got := mysqlIDs(t, db, "status = 'VoidedDuplicate' AND voided_from_status = 'Paid' AND voided_by = 'acct:mai'"); !reflect.DeepEqual(got, expectedPaid) {
		t.Fatalf("paid rows voided with their previous status: %v", got)
	}

	ddl, err := a.GuardDDL("")
	if err != nil || !strings.Contains(ddl, "VIRTUAL, ALGORITHM=INPLACE, LOCK=NONE;\nALTER TABLE `invoices` ADD UNIQUE INDEX `ux_invoices_customer_id_period` (`customer_id`, `period`, `idem_live`), ALGORITHM=INPLACE, LOCK=NONE;") {
		t.Fatalf("guard DDL %q %v", ddl, err)
	}
	g, err := a.Guard(ctx, "")
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
	if g, err = a.Guard(ctx, ""); err != nil || g.Created || g.Existing == "" {
		t.Fatalf("second guard: %+v %v", g, err)
	}

	// The fence: a live copy is refused, a voided one allowed.
	_, err = db.Exec("INSERT INTO invoices (customer_id, period, amount, created_at) VALUES ('c-1', '2026-03', 100, UTC_TIMESTAMP())")
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1062 {
		t.Fatalf("inserting a live duplicate after guard: %v", err)
	}
	if _, err := db.Exec("INSERT INTO invoices (customer_id, period, amount, status, created_at) VALUES ('c-1', '2026-03', 100, 'VoidedDuplicate', UTC_TIMESTAMP())"); err != nil {
		t.Fatalf("inserting a voided row after guard: %v", err)
	}
	// Un-voiding a voided copy is refused too: the generated column follows
	// the status.
	if _, err := db.Exec("UPDATE invoices SET status = 'Issued' WHERE id = 2"); !errors.As(err, &me) || me.Number != 1062 {
		t.Fatalf("reviving a voided duplicate after guard: %v", err)
	}

	// Bypass: drop the index and write a duplicate; check sees both. A
	// second guard reuses the generated column and fails on the duplicate.
	if _, err := db.Exec("ALTER TABLE invoices DROP INDEX ux_invoices_customer_id_period; INSERT INTO invoices (customer_id, period, amount, created_at) VALUES ('c-1', '2026-03', 100, UTC_TIMESTAMP())"); err != nil {
		t.Fatal(err)
	}
	chk, err = a.Check(ctx)
	if err != nil || chk.Groups != 1 || chk.GuardIndex != "" {
		t.Fatalf("check after bypass: %+v %v", chk, err)
	}
	if _, err := a.Guard(ctx, ""); !errors.Is(err, audit.ErrViolations) {
		t.Fatalf("guard after bypass: %v", err)
	}
}

// A NULL status counts as live and is fenced, unlike PostgreSQL's partial
// index; a plain unique index guards a table without a status column.
func TestMySQLGuardNullStatusAndNoStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqlDB(t)
	if _, err := db.Exec("CREATE TABLE t (id int PRIMARY KEY, k varchar(10), status varchar(20) NULL, created_at datetime NOT NULL); INSERT INTO t VALUES (1, 'a', NULL, '2026-01-01'), (2, 'b', 'VoidedDuplicate', '2026-01-01')"); err != nil {
		t.Fatal(err)
	}
	a := newMySQLAuditor(t, db, audit.Spec{Table: "t", Key: []string{"k"}})
	if g, err := a.Guard(ctx, ""); err != nil || !g.Created || len(g.Warnings) != 0 {
		t.Fatalf("guard %+v %v", g, err)
	}
	var me *mysql.MySQLError
	if _, err := db.Exec("INSERT INTO t (id, k, status, created_at) VALUES (3, 'a', NULL, '2026-01-02')"); !errors.As(err, &me) || me.Number != 1062 {
		t.Fatalf("second NULL-status row: %v", err)
	}
	if _, err := db.Exec("INSERT INTO t (id, k, status, created_at) VALUES (4, 'b', 'VoidedDuplicate', '2026-01-02')"); err != nil {
		t.Fatalf("second voided row: %v", err)
	}

	if _, err := db.Exec("CREATE TABLE plain (id int PRIMARY KEY, k varchar(10), created_at datetime NOT NULL); INSERT INTO plain VALUES (1, 'a', '2026-01-01')"); err != nil {
		t.Fatal(err)
	}
	p := newMySQLAuditor(t, db, audit.Spec{Table: "plain", Key: []string{"k"}, Status: audit.NoColumn})
	if ddl, _ := p.GuardDDL("ux_plain"); ddl != "ALTER TABLE `plain` ADD UNIQUE INDEX `ux_plain` (`k`), ALGORITHM=INPLACE, LOCK=NONE;" {
		t.Fatalf("plain guard DDL %q", ddl)
	}
	if g, err := p.Guard(ctx, "ux_plain"); err != nil || !g.Created {
		t.Fatalf("plain guard %+v %v", g, err)
	}
	if chk, err := p.Check(ctx); err != nil || chk.GuardIndex != "ux_plain" {
		t.Fatalf("plain check %+v %v", chk, err)
	}
	// An index name taken by a non-unique index of the table is refused.
	if _, err := db.Exec("CREATE INDEX ix_k ON t (k)"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Guard(ctx, "ix_k"); !errors.Is(err, audit.ErrIndexNameTaken) {
		t.Fatalf("guard on a taken name: %v", err)
	}
	// The live column of one void value is not reused for another.
	if _, err := db.Exec("DELETE FROM t WHERE id = 4"); err != nil {
		t.Fatal(err)
	}
	other := newMySQLAuditor(t, db, audit.Spec{Table: "t", Key: []string{"k"}, VoidValue: "Cancelled"})
	if _, err := other.Guard(ctx, "ux_t_k_cancelled"); !errors.Is(err, audit.ErrIndexNameTaken) || !strings.Contains(err.Error(), "idem_live") {
		t.Fatalf("guard with another void value: %v", err)
	}
}

func TestMySQLNamesAndSpec(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqlSeed(t)
	if _, err := audit.NewMySQL(db, audit.Spec{Table: "invoices", Key: []string{"customer_id"}, ID: audit.NoColumn}); !errors.Is(err, audit.ErrInvalidSpec) {
		t.Fatalf("no id column: %v", err)
	}
	if _, err := audit.NewMySQL(db, audit.Spec{Table: "invoices`; DROP TABLE invoices; --", Key: []string{"customer_id"}}); !errors.Is(err, audit.ErrInvalidName) {
		t.Fatalf("hostile table name: %v", err)
	}
	if _, err := newMySQLAuditor(t, db, audit.Spec{Table: "Invoices", Key: []string{"customer_id"}}).Check(ctx); !errors.Is(err, audit.ErrNotFound) {
		t.Fatalf("table names match exactly: %v", err)
	}
	if _, err := newMySQLAuditor(t, db, audit.Spec{Table: "invoices", Key: []string{"customer"}}).Check(ctx); !errors.Is(err, audit.ErrNotFound) || !strings.Contains(err.Error(), "has no column customer") {
		t.Fatalf("missing column: %v", err)
	}
	// Schema-qualified: the database name.
	var name string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	other := mysqlDB(t)
	chk, err := newMySQLAuditor(t, other, audit.Spec{Table: name + ".invoices", Key: []string{"customer_id", "period"}}).Check(ctx)
	if err != nil || chk.Groups != 6 {
		t.Fatalf("qualified check %+v %v", chk, err)
	}
	// An ENUM status with a name that needs quoting.
	if _, err := db.Exec("CREATE TABLE `order$s` (id int PRIMARY KEY, `key` varchar(10) NOT NULL, `status` ENUM('Open', 'Paid', 'VoidedDuplicate') NOT NULL, created_at datetime NOT NULL); INSERT INTO `order$s` VALUES (1, 'x', 'Open', '2026-01-01'), (2, 'x', 'Open', '2026-01-02'), (3, 'x', 'Paid', '2026-01-03')"); err != nil {
		t.Fatal(err)
	}
	e := newMySQLAuditor(t, db, audit.Spec{Table: "order$s", Key: []string{"key"}})
	res, err := e.Void(ctx, audit.VoidOptions{Apply: true, Force: true, AddColumns: true, Reason: "r", Actor: "a"})
	if err != nil || len(res.Voided) != 1 || res.Voided[0].ID != "2" || len(res.Refund) != 1 {
		t.Fatalf("enum void %+v %v", res, err)
	}
	var st string
	if err := db.QueryRow("SELECT status FROM `order$s` WHERE id = 2").Scan(&st); err != nil || st != "VoidedDuplicate" {
		t.Fatalf("enum status %q %v", st, err)
	}
}

// A writer holding a lock on a row the void would list makes the void fail
// with ErrConcurrentChange (lock wait timeout) and write nothing.
func TestMySQLVoidWritesNothingWhenARowIsLocked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqlSeed(t)
	a := newMySQLAuditor(t, db, spec())
	if _, err := a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, AddColumns: true, Reason: "r", Actor: "a"}); err != nil {
		t.Fatal(err) // adds the columns; paid extras remain
	}
	before := mysqlSnapshot(t, db)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.Exec("UPDATE invoices SET amount = amount WHERE id = 11"); err != nil {
		t.Fatal(err)
	}
	_, err = a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, IncludePaid: true, Reason: "r2", Actor: "a", LockTimeout: time.Second})
	if !errors.Is(err, audit.ErrConcurrentChange) {
		t.Fatalf("void against a locked row: %v", err)
	}
	_ = tx.Rollback()
	if after := mysqlSnapshot(t, db); after != before {
		t.Fatalf("failed void changed the table:\n%s\n---\n%s", before, after)
	}
	var n int
	if err := db.QueryRow("SELECT @@session.innodb_lock_wait_timeout").Scan(&n); err != nil || n == 1 {
		t.Fatalf("pooled innodb_lock_wait_timeout %d (%v): the void's setting leaked", n, err)
	}
}

// A duplicate committed by a transaction that was open when the guard
// started fails the guard with ErrViolations (whether the pre-check or the
// build sees it) and leaves no index.
func TestMySQLGuardFailsOnADuplicateWrittenMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqlDB(t)
	if _, err := db.Exec("CREATE TABLE t (id int PRIMARY KEY, k varchar(10) NOT NULL, status varchar(20) NOT NULL, created_at datetime NOT NULL); INSERT INTO t VALUES (1, 'a', 'Issued', '2026-01-01')"); err != nil {
		t.Fatal(err)
	}
	a := newMySQLAuditor(t, db, audit.Spec{Table: "t", Key: []string{"k"}})
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO t VALUES (2, 'a', 'Issued', '2026-01-02')"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		// The guard's DDL waits for this transaction's metadata lock.
		time.Sleep(500 * time.Millisecond)
		done <- tx.Commit()
	}()
	_, err = a.Guard(ctx, "ux_t_k")
	if cerr := <-done; cerr != nil {
		t.Fatal(cerr)
	}
	if !errors.Is(err, audit.ErrViolations) {
		t.Fatalf("guard with a duplicate written meanwhile: %v", err)
	}
	t.Logf("guard: %v", err)
	chk, err := a.Check(ctx)
	if err != nil || chk.Groups != 1 || chk.GuardIndex != "" {
		t.Fatalf("check after the failed guard: %+v %v", chk, err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 't' AND INDEX_NAME = 'ux_t_k'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("index left behind: %d (%v)", n, err)
	}
}

// With parseTime=true the driver sends time.Time; the report reads the
// same times.
func TestMySQLParseTime(t *testing.T) {
	t.Parallel()
	db := mysqlSeed(t)
	var name string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	dsn := os.Getenv("IDEM_MYSQL_URL")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName, cfg.ParseTime = name, true
	pt, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pt.Close()
	rep, err := newMySQLAuditor(t, pt, spec()).Duplicates(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if age := rep.Summary.Activity.Age(); age < 2*time.Minute || age > 3*time.Minute {
		t.Fatalf("newest duplicate age %v, want about 2m", age)
	}
	if c4 := rep.Groups[2]; c4.Latest.Sub(*c4.Earliest) != 600*time.Second {
		t.Fatalf("c-4 earliest %v latest %v", c4.Earliest, c4.Latest)
	}
}

// More extra rows than one UPDATE takes ids: the void runs in batches, in
// one transaction, and voids them all.
func TestMySQLVoidManyRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqlDB(t)
	var b strings.Builder
	b.WriteString("CREATE TABLE t (id int PRIMARY KEY, k varchar(10) NOT NULL, status varchar(20) NOT NULL, created_at datetime(6) NOT NULL);\nINSERT INTO t VALUES ")
	const n = 2500
	for i := 1; i <= n; i++ {
		if i > 1 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%d, 'k-%d', 'Issued', '2026-01-01 00:00:00' + INTERVAL %d SECOND)", i, i%3, i)
	}
	if _, err := db.Exec(b.String()); err != nil {
		t.Fatal(err)
	}
	a := newMySQLAuditor(t, db, audit.Spec{Table: "t", Key: []string{"k"}})
	res, err := a.Void(ctx, audit.VoidOptions{Apply: true, AddColumns: true, Reason: "r", Actor: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Applied || len(res.Voided) != n-3 || res.Groups != 3 {
		t.Fatalf("voided %d rows in %d groups, want %d in 3", len(res.Voided), res.Groups, n-3)
	}
	var live int
	if err := db.QueryRow("SELECT count(*) FROM t WHERE status = 'Issued'").Scan(&live); err != nil || live != 3 {
		t.Fatalf("live rows %d (%v), want 3", live, err)
	}
	if g, err := a.Guard(ctx, ""); err != nil || !g.Created {
		t.Fatalf("guard %+v %v", g, err)
	}
}

// On a database opened for the inbox (mysqlinbox.Open: ANSI_QUOTES,
// parseTime, time_zone +00:00 from the DSN) the audit works the same and
// gives its connections back with the DSN's settings.
func TestMySQLOnAnInboxDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seeded := mysqlSeed(t)
	var name string
	if err := seeded.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	dsn := os.Getenv("IDEM_MYSQL_URL")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	db, err := mysqlinbox.Open(cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // every statement below shares the audit's connection
	a := newMySQLAuditor(t, db, spec())
	rep, err := a.Duplicates(ctx, 0)
	if err != nil || rep.Summary.Groups != 6 {
		t.Fatalf("duplicates %+v %v", rep, err)
	}
	res, err := a.Void(ctx, audit.VoidOptions{Apply: true, Force: true, AddColumns: true, Reason: "r", Actor: "a", LockTimeout: 3 * time.Second})
	if err != nil || len(res.Voided) != 6 {
		t.Fatalf("void %+v %v", res, err)
	}
	var tz string
	var wait int
	if err := db.QueryRow("SELECT @@session.time_zone, @@session.innodb_lock_wait_timeout").Scan(&tz, &wait); err != nil || tz != "+00:00" || wait == 3 {
		t.Fatalf("connection after the audit: time_zone %q innodb_lock_wait_timeout %d (%v), want the DSN's +00:00 and the server's wait", tz, wait, err)
	}
}
