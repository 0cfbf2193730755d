package idemtest_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// Compare tells what changed between two snapshots, naming the table, the
// row and each column's value before → after.
func ExampleCompare() {
	snap := func(balance string) *idemtest.Snapshot {
		s := &idemtest.Snapshot{}
		s.AddTable("balances", []string{"account", "balance"}, []string{"account"}).
			Add(idemtest.Row{"account": "acc-1", "balance": balance})
		return s
	}
	d := idemtest.Compare(snap("12500"), snap("25000"))
	fmt.Println(d)
	fmt.Println(d.Summary())
	// Output:
	//   balances row account=acc-1 changed: balance 12500 → 25000
	// balances.balance changed in 1 row
}

// Probe delivers a sample message twice to each legacy consumer (written
// without idem) on a real database, here SQLite in a temporary directory,
// and Plan turns the findings into the prioritized fix plan.
func ExamplePlan() {
	dir, err := os.MkdirTemp("", "idemtest")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqliteinbox.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	for _, q := range []string{
		`CREATE TABLE invoices (id INTEGER PRIMARY KEY, customer TEXT, period TEXT, total INTEGER)`,
		`CREATE TABLE stock (product TEXT PRIMARY KEY, qty INTEGER)`,
		`CREATE TABLE emails_sent (kind TEXT, lead TEXT, PRIMARY KEY (kind, lead))`,
		`INSERT INTO stock VALUES ('sku-1', 10)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			panic(err)
		}
	}
	run := func(q string) idemtest.LegacyHandler {
		return func(ctx context.Context, _ idem.Message) error {
			_, err := db.ExecContext(ctx, q)
			return err
		}
	}
	snap := idemtest.SQLite(db, nil)
	msg := idem.Message{ID: "evt-1"}
	var findings []idemtest.Finding
	for _, l := range []idemtest.Legacy{
		{Consumer: "stock-reserver", Handler: run(`UPDATE stock SET qty = qty - 2`),
			Severity: idemtest.High, Damage: "overselling", Fix: "key {order}:{product}"},
		{Consumer: "invoice-creator", Handler: run(`INSERT INTO invoices (customer, period, total) VALUES ('cus-8421', '2026-09', 2400000)`),
			Severity: idemtest.Critical, Damage: "customer charged twice", Fix: "key invoice:{customer}:{period}"},
		{Consumer: "email-sender", Handler: run(`INSERT INTO emails_sent VALUES ('welcome', 'lead-1') ON CONFLICT DO NOTHING`),
			Severity: idemtest.Medium},
	} {
		l.Sample, l.Snapshot = msg, snap
		f, err := idemtest.Probe(ctx, l)
		if err != nil {
			panic(err)
		}
		findings = append(findings, f)
	}
	fmt.Print(idemtest.Plan(findings))
	// Output:
	// | # | consumer | severity | damage | changed by the 2nd delivery | suggested fix |
	// |--:|---|---|---|---|---|
	// | 1 | invoice-creator | critical | customer charged twice | invoices +1 row | key invoice:{customer}:{period} |
	// | 2 | stock-reserver | high | overselling | stock.qty changed in 1 row | key {order}:{product} |
	//
	// 2 of 3 consumers not idempotent. Idempotent: email-sender.
}

// SQLite snapshots every table of a database except the inbox, so a check
// sees changes nobody thought to assert on.
func ExampleSQLite() {
	dir, err := os.MkdirTemp("", "idemtest")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqliteinbox.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	store, err := sqlinbox.New(db, sqlinbox.SQLite, nil)
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	mustExec(db, `CREATE TABLE balances (account TEXT PRIMARY KEY, balance INTEGER, updated_at TEXT)`)
	mustExec(db, `INSERT INTO balances VALUES ('acc-1', 0, NULL)`)

	snap := idemtest.SQLite(db, &idemtest.SnapshotOptions{Ignore: []string{"updated_at"}})
	before, err := snap.Snapshot(ctx)
	if err != nil {
		panic(err)
	}
	mustExec(db, `UPDATE balances SET balance = balance + 12500, updated_at = datetime('now')`)
	mustExec(db, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('ledger', 'evt-1', 'evt-1', x'00')`)
	after, err := snap.Snapshot(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(before.TableNames())
	fmt.Println(idemtest.Compare(before, after))
	// Output:
	// [balances]
	//   balances row account=acc-1 changed: balance 0 → 12500
}

func mustExec(db *sql.DB, q string) {
	if _, err := db.Exec(q); err != nil {
		panic(err)
	}
}
