package idemtest_test

import (
	"context"
	"database/sql"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/mysqlinbox"
)

// mysqlDB opens a fresh database on the server IDEM_MYSQL_URL names
// (mysqltest), dropped when t ends.
func mysqlDB(t *testing.T) *sql.DB {
	t.Helper()
	cfg := mysqltest.Database(t, "idemtest_")
	cfg.MultiStatements = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

const mysqlTypesDDL = "CREATE TABLE invoices (customer varchar(40), period varchar(7), amount decimal(12,2), meta json, raw varbinary(8)," +
	" issued_at datetime(6), note text, n int, f double, b bit(3), updated_at timestamp(6) DEFAULT CURRENT_TIMESTAMP(6), PRIMARY KEY (period, customer));" +
	"CREATE TABLE audit_log (event varchar(10), detail text);" +
	"CREATE TABLE events (id bigint, at date NOT NULL, PRIMARY KEY (at, id)) PARTITION BY RANGE COLUMNS (at) (PARTITION p2026 VALUES LESS THAN ('2027-01-01'), PARTITION pmax VALUES LESS THAN (MAXVALUE));" +
	"CREATE TABLE `Odd ``Name`` x` (`a b` int PRIMARY KEY);" +
	"CREATE TABLE idem_inbox (k varchar(10) PRIMARY KEY);" +
	"CREATE VIEW v_invoices AS SELECT customer FROM invoices;" +
	"INSERT INTO invoices (customer, period, amount, meta, raw, issued_at, note, n, f, b) VALUES" +
	" ('cus-1', '2026-09', 4800000.50, '{\"b\":1}', x'dead', '2026-09-01 00:00:00', NULL, 3, 0.5, b'101')," +
	" ('cus-2', '2026-09', 2400000, NULL, NULL, NULL, 'NULL', NULL, NULL, NULL);" +
	"INSERT INTO audit_log VALUES ('x', 'same'), ('x', 'same');" +
	"INSERT INTO events VALUES (7, '2026-03-01'), (8, '2030-01-01');" +
	"INSERT INTO `Odd ``Name`` x` VALUES (1);" +
	"INSERT INTO idem_inbox VALUES ('m-1')"

func TestMySQLSnapshot(t *testing.T) {
	t.Parallel()
	db := mysqlDB(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, mysqlTypesDDL); err != nil {
		t.Fatal(err)
	}
	snap := idemtest.MySQL(db, &idemtest.SnapshotOptions{Ignore: []string{"invoices.updated_at"}})
	s, err := snap.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.TableNames(), []string{"Odd `Name` x", "audit_log", "events", "invoices"}; !slices.Equal(got, want) {
		t.Fatalf("tables %q, want %q (the inbox and the view left out)", got, want)
	}
	inv := s.Table("invoices")
	if !slices.Equal(inv.Key, []string{"period", "customer"}) || slices.Contains(inv.Columns, "updated_at") {
		t.Errorf("key %q columns %q", inv.Key, inv.Columns)
	}
	r := inv.Row("period=2026-09, customer=cus-1")
	for col, want := range map[string]string{
		"amount": "4800000.50", "meta": `{"b":1}`, "raw": `\xdead`, "issued_at": "2026-09-01 00:00:00.000000",
		"n": "3", "f": "0.5", "b": `\x05`,
	} {
		if r[col] != want {
			t.Errorf("%s = %q, want %q", col, r[col], want)
		}
	}
	r2 := inv.Row("period=2026-09, customer=cus-2")
	if _, ok := r2["note"]; !ok || r2["note"] != "NULL" {
		t.Errorf("the text 'NULL' = %q, %v", r2["note"], ok)
	}
	if _, ok := r2["raw"]; ok {
		t.Errorf("NULL raw present: %q", r2["raw"])
	}
	if got := s.Table("audit_log").RowKeys(); !slices.Equal(got, []string{"event=x, detail=same", "event=x, detail=same #2"}) {
		t.Errorf("keyless rows %q", got)
	}
	if got := s.Table("events").RowKeys(); !slices.Equal(got, []string{"at=2026-03-01, id=7", "at=2030-01-01, id=8"}) {
		t.Errorf("partitioned table rows %q", got)
	}
	if got := s.Table("Odd `Name` x").RowKeys(); !slices.Equal(got, []string{"a b=1"}) {
		t.Errorf("odd names: %q", got)
	}

	// Only updated_at changes: nothing to report.
	if _, err := db.ExecContext(ctx, "UPDATE invoices SET updated_at = '2030-01-01' WHERE customer = 'cus-1'"); err != nil {
		t.Fatal(err)
	}
	s1, err := snap.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := idemtest.Compare(s, s1); !d.Empty() {
		t.Errorf("ignored column reported:\n%s", d)
	}
	if _, err := db.ExecContext(ctx, "UPDATE invoices SET n = n + 1, raw = x'beef' WHERE customer = 'cus-1'; INSERT INTO audit_log VALUES ('y', NULL); DELETE FROM events WHERE id = 8"); err != nil {
		t.Fatal(err)
	}
	s2, err := snap.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := idemtest.Compare(s, s2).String()
	for _, want := range []string{
		`invoices row period=2026-09, customer=cus-1 changed: raw \xdead → \xbeef, n 3 → 4`,
		"audit_log row added: event=y, detail=NULL",
		"events row removed: id=8, at=2030-01-01",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("diff lacks %q:\n%s", want, got)
		}
	}
}

// The same effect applied twice (what a second delivery without the inbox
// does) shows in the diff against the state after one.
func TestMySQLSnapshotDoubleEffect(t *testing.T) {
	t.Parallel()
	db := mysqlDB(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE balances (account varchar(20) PRIMARY KEY, balance bigint NOT NULL); INSERT INTO balances VALUES ('acc-1', 0)"); err != nil {
		t.Fatal(err)
	}
	snap := idemtest.MySQL(db, nil)
	effect := func() {
		t.Helper()
		if _, err := db.ExecContext(ctx, "UPDATE balances SET balance = balance + 12500 WHERE account = 'acc-1'"); err != nil {
			t.Fatal(err)
		}
	}
	effect()
	once, err := snap.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	effect()
	twice, err := snap.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := idemtest.Compare(once, twice).String(), "  balances row account=acc-1 changed: balance 12500 → 25000"; got != want {
		t.Errorf("diff:\n%s\nwant:\n%s", got, want)
	}
}

func TestMySQLSnapshotNamedTables(t *testing.T) {
	t.Parallel()
	db := mysqlDB(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, mysqlTypesDDL); err != nil {
		t.Fatal(err)
	}
	s, err := idemtest.MySQL(db, &idemtest.SnapshotOptions{Tables: []string{"idem_inbox", "events"}}).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.TableNames(); !slices.Equal(got, []string{"events", "idem_inbox"}) {
		t.Errorf("tables %q", got)
	}
	if _, err := idemtest.MySQL(db, &idemtest.SnapshotOptions{Tables: []string{"nope"}}).Snapshot(ctx); err == nil || !strings.Contains(err.Error(), "nope does not exist") {
		t.Errorf("missing table: %v", err)
	}
	// Another database, named explicitly.
	other := mysqlDB(t)
	if _, err := other.ExecContext(ctx, "CREATE TABLE t (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	var name string
	if err := other.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	s, err = idemtest.MySQL(db, &idemtest.SnapshotOptions{Schema: name}).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.TableNames(); !slices.Equal(got, []string{"t"}) {
		t.Errorf("tables of %s: %q", name, got)
	}
}

// mysqlInboxDB is mysqlDB reopened as the inbox opens it
// (mysqlinbox.Open: parseTime, ANSI_QUOTES, time_zone +00:00).
func mysqlInboxDB(t *testing.T) *sql.DB {
	t.Helper()
	plain := mysqlDB(t)
	var name string
	if err := plain.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
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
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func TestMySQLDeliverTwice(t *testing.T) {
	t.Parallel()
	db := mysqlInboxDB(t)
	setup := sqlSetup(db, mysqlinbox.Dialect, idemtest.MySQL(db, nil),
		`CREATE TABLE balances (account varchar(20) PRIMARY KEY, balance bigint NOT NULL, at datetime(6) NOT NULL); INSERT INTO balances VALUES ('acc-1', 0, '2026-01-01 00:00:00')`,
		`UPDATE balances SET balance = balance + 12500 WHERE account = 'acc-1'`)
	mustFail(t, func(tb testing.TB) {
		proc, snap := setup(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap)
	}, "ledger-credit is not idempotent", "balances row account=acc-1 changed: balance 12500 → 25000")

	// The store's own tables are left out; parseTime's time.Time reads as
	// RFC 3339.
	s, err := idemtest.MySQL(db, nil).Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := s.TableNames(); !slices.Equal(got, []string{"balances"}) {
		t.Fatalf("tables %q, want the inbox's own left out", got)
	}
	if r := s.Table("balances").Row("account=acc-1"); r["at"] != "2026-01-01T00:00:00Z" {
		t.Errorf("at = %q", r["at"])
	}
}
