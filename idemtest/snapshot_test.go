package idemtest_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/pgxinbox"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

const pgTypesDDL = `
CREATE TABLE invoices (customer text, period text, amount numeric(12,2), meta jsonb, raw bytea,
  issued_at timestamptz, note text, updated_at timestamptz, PRIMARY KEY (period, customer));
CREATE TABLE audit_log (event text, detail text);
CREATE TABLE events (id bigint, at date NOT NULL, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE TABLE "Odd ""Name""" ("a b" int PRIMARY KEY);
INSERT INTO invoices VALUES ('cus-1', '2026-09', 4800000.50, '{"b":1,"a":2}', '\xdead', '2026-09-01T00:00:00Z', NULL, now()),
                            ('cus-2', '2026-09', 2400000, NULL, NULL, NULL, 'NULL', now());
INSERT INTO audit_log VALUES ('x', 'same'), ('x', 'same');
INSERT INTO events VALUES (7, '2026-03-01');
INSERT INTO "Odd ""Name""" VALUES (1);`

func pgTables(t *testing.T) (*idemtest.Snapshot, idemtest.Snapshotter, func(string)) {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := pgxinbox.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, pgTypesDDL); err != nil {
		t.Fatal(err)
	}
	snap := idemtest.Postgres(pool, &idemtest.SnapshotOptions{Ignore: []string{"invoices.updated_at"}})
	s, err := snap.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run := func(q string) {
		t.Helper()
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return s, snap, run
}

func TestPostgresSnapshot(t *testing.T) {
	t.Parallel()
	s, _, _ := pgTables(t)
	if got, want := s.TableNames(), []string{"Odd \"Name\"", "audit_log", "events", "invoices"}; !slices.Equal(got, want) {
		t.Fatalf("tables %q, want %q (inbox and migrations left out, partition read through its parent)", got, want)
	}
	inv := s.Table("invoices")
	if !slices.Equal(inv.Key, []string{"period", "customer"}) {
		t.Errorf("key %q, want the primary key in index order", inv.Key)
	}
	if slices.Contains(inv.Columns, "updated_at") {
		t.Errorf("ignored column updated_at was read: %q", inv.Columns)
	}
	if got := inv.RowKeys(); !slices.Equal(got, []string{"period=2026-09, customer=cus-1", "period=2026-09, customer=cus-2"}) {
		t.Errorf("row keys %q", got)
	}
	r := inv.Row("period=2026-09, customer=cus-1")
	for col, want := range map[string]string{"amount": "4800000.50", "meta": `{"a": 2, "b": 1}`, "raw": `\xdead`, "issued_at": "2026-09-01 00:00:00+00"} {
		if r[col] != want {
			t.Errorf("%s = %q, want %q", col, r[col], want)
		}
	}
	if _, ok := r["note"]; ok {
		t.Errorf("NULL note is present in the row: %q", r["note"])
	}
	if v := inv.Row("period=2026-09, customer=cus-2")["note"]; v != "NULL" {
		t.Errorf("text 'NULL' read as %q", v)
	}
	if got := s.Table("audit_log").RowKeys(); !slices.Equal(got, []string{"event=x, detail=same", "event=x, detail=same #2"}) {
		t.Errorf("keyless rows %q, want whole-row keys with a count", got)
	}
	if got := s.Table("events").RowKeys(); !slices.Equal(got, []string{"id=7, at=2026-03-01"}) {
		t.Errorf("partitioned rows %q", got)
	}
}

func TestPostgresSnapshotDiff(t *testing.T) {
	t.Parallel()
	s0, snap, run := pgTables(t)
	run(`UPDATE invoices SET amount = amount * 2, note = 'x', updated_at = now() + interval '1 day' WHERE customer = 'cus-1';
	     UPDATE invoices SET note = NULL WHERE customer = 'cus-2';
	     INSERT INTO audit_log VALUES ('x', 'same');
	     DELETE FROM events;
	     INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('c', 'k', 'm', '\x00')`)
	s1, err := snap.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d := idemtest.Compare(s0, s1)
	got := d.String()
	for _, want := range []string{
		"invoices row period=2026-09, customer=cus-1 changed: amount 4800000.50 → 9600001.00, note NULL → x",
		`invoices row period=2026-09, customer=cus-2 changed: note "NULL" → NULL`,
		"audit_log row added: event=x, detail=same",
		"events row removed: id=7, at=2026-03-01",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("diff lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "updated_at") || strings.Contains(got, "idem_inbox") {
		t.Errorf("diff shows an ignored column or the inbox:\n%s", got)
	}
	if d.Len() != 4 {
		t.Errorf("diff counts %d rows, want 4", d.Len())
	}
	if want := "audit_log +1 row; events -1 row; invoices.amount changed in 1 row; invoices.note changed in 2 rows"; d.Summary() != want {
		t.Errorf("summary %q, want %q", d.Summary(), want)
	}
}

func TestPostgresSnapshotNamedTables(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY); CREATE TABLE idem_inbox (id int)`); err != nil {
		t.Fatal(err)
	}
	s, err := idemtest.Postgres(pool, &idemtest.SnapshotOptions{Tables: []string{"b", "idem_inbox"}}).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.TableNames(); !slices.Equal(got, []string{"b", "idem_inbox"}) {
		t.Errorf("tables %q, want only the named ones", got)
	}
	s, err = idemtest.Postgres(pool, &idemtest.SnapshotOptions{Exclude: []string{"a"}}).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.TableNames(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("tables %q, want b alone", got)
	}
	if _, err := idemtest.Postgres(pool, &idemtest.SnapshotOptions{Tables: []string{"nope"}}).Snapshot(ctx); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing named table: err = %v", err)
	}
}

// TestPostgresSQLSnapshot reads PostgreSQL through database/sql and a
// sqlinbox store: the same catalog, another driver.
func TestPostgresSQLSnapshot(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	setup := sqlSetup(db, sqlinbox.Postgres, idemtest.PostgresSQL(db, nil),
		`CREATE TABLE balances (account text PRIMARY KEY, balance bigint NOT NULL); INSERT INTO balances VALUES ('acc-1', 0)`,
		`UPDATE balances SET balance = balance + 12500 WHERE account = 'acc-1'`)
	mustFail(t, func(tb testing.TB) {
		proc, snap := setup(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap)
	}, "balances row account=acc-1 changed: balance 12500 → 25000")
}

// sqlSetup builds a falsely natural consumer that runs effect on db.
func sqlSetup(db *sql.DB, d sqlinbox.Dialect, snap idemtest.Snapshotter, ddl, effect string) idemtest.Setup[*sql.Tx] {
	return func(t testing.TB, faults idem.FaultFunc) (*idem.Processor[*sql.Tx], idemtest.Snapshotter) {
		ctx := context.Background()
		store, err := sqlinbox.New(db, d, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		for _, q := range strings.Split(ddl, ";") {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		proc, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{Consumer: "ledger-credit", Natural: true, Logger: quiet, Faults: faults,
			Handler: func(ctx context.Context, tx *sql.Tx, _ idem.Message) error {
				_, err := tx.ExecContext(ctx, effect)
				return err
			}})
		if err != nil {
			t.Fatal(err)
		}
		return proc, snap
	}
}

func openSQLite(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sqliteinbox.Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func TestSQLiteSnapshot(t *testing.T) {
	t.Parallel()
	db := openSQLite(t)
	ctx := context.Background()
	store, err := sqlinbox.New(db, sqlinbox.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE invoices (customer TEXT, period TEXT, amount REAL, raw BLOB, n INTEGER, note TEXT, updated_at TEXT, PRIMARY KEY (period, customer))`,
		`CREATE TABLE audit_log (event TEXT)`,
		`INSERT INTO invoices VALUES ('cus-1', '2026-09', 4800000.5, x'dead', 3, NULL, 'now'), ('cus-2', '2026-09', 2400000, NULL, NULL, 'NULL', 'now')`,
		`INSERT INTO audit_log VALUES ('x'), ('x')`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	snap := idemtest.SQLite(db, &idemtest.SnapshotOptions{Ignore: []string{"updated_at"}})
	s, err := snap.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.TableNames(); !slices.Equal(got, []string{"audit_log", "invoices"}) {
		t.Fatalf("tables %q, want the inbox and migrations left out", got)
	}
	inv := s.Table("invoices")
	if !slices.Equal(inv.Key, []string{"period", "customer"}) || slices.Contains(inv.Columns, "updated_at") {
		t.Errorf("key %q columns %q", inv.Key, inv.Columns)
	}
	r := inv.Row("period=2026-09, customer=cus-1")
	for col, want := range map[string]string{"amount": "4.8000005e+06", "raw": `\xdead`, "n": "3"} {
		if r[col] != want {
			t.Errorf("%s = %q, want %q", col, r[col], want)
		}
	}
	if _, ok := r["note"]; ok {
		t.Errorf("NULL note present: %q", r["note"])
	}
	if got := s.Table("audit_log").RowKeys(); !slices.Equal(got, []string{"event=x", "event=x #2"}) {
		t.Errorf("keyless rows %q", got)
	}
	if _, err := db.ExecContext(ctx, `UPDATE invoices SET n = n + 1, updated_at = 'later' WHERE customer = 'cus-1'`); err != nil {
		t.Fatal(err)
	}
	s1, err := snap.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := idemtest.Compare(s, s1).String(), "  invoices row period=2026-09, customer=cus-1 changed: n 3 → 4"; got != want {
		t.Errorf("diff:\n%s\nwant:\n%s", got, want)
	}
}

func TestSQLiteDeliverTwice(t *testing.T) {
	t.Parallel()
	db := openSQLite(t)
	setup := sqlSetup(db, sqlinbox.SQLite, idemtest.SQLite(db, nil),
		`CREATE TABLE balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL); INSERT INTO balances VALUES ('acc-1', 0)`,
		`UPDATE balances SET balance = balance + 12500 WHERE account = 'acc-1'`)
	mustFail(t, func(tb testing.TB) {
		proc, snap := setup(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap)
	}, "ledger-credit is not idempotent", "balances row account=acc-1 changed: balance 12500 → 25000")
}

func TestCombine(t *testing.T) {
	t.Parallel()
	var sent []string
	mailer := idemtest.SnapshotFunc(func(context.Context) (*idemtest.Snapshot, error) {
		s := &idemtest.Snapshot{}
		tb := s.AddTable("mail", []string{"to"}, nil)
		for _, to := range sent {
			tb.Add(idemtest.Row{"to": to})
		}
		return s, nil
	})
	snap := idemtest.Combine(mailer, idemtest.SnapshotFunc(func(context.Context) (*idemtest.Snapshot, error) {
		s := &idemtest.Snapshot{}
		s.AddTable("other", []string{"x"}, []string{"x"})
		return s, nil
	}))
	s0, err := snap.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sent = append(sent, "cus-1@example.com")
	s1, _ := snap.Snapshot(context.Background())
	if got := idemtest.Compare(s0, s1).String(); got != "  mail row added: to=cus-1@example.com" {
		t.Errorf("diff %q", got)
	}
	if _, err := idemtest.Combine(mailer, mailer).Snapshot(context.Background()); err == nil {
		t.Error("combining two snapshotters of the same table: no error")
	}
}

// pgx.Tx satisfies PgxQuerier, so a snapshot can be taken inside a
// transaction.
var _ idemtest.PgxQuerier = pgx.Tx(nil)
