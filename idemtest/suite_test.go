package idemtest_test

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/sqlinbox"
)

// wiredConsumers stands for the application's own list, taken from the code
// that starts its consumers.
var wiredConsumers = []string{"ledger-credit", "ledger-set"}

func goodSuite() *idemtest.Suite[pgx.Tx] {
	var s idemtest.Suite[pgx.Tx]
	s.Register("ledger-credit", idemtest.Case[pgx.Tx]{Sample: sample, Setup: pgSetup(balancesDDL, guarded, nil)})
	s.Register("ledger-set", ledgerSet())
	return &s
}

// ledgerSet sets the balance: naturally idempotent.
func ledgerSet() idemtest.Case[pgx.Tx] {
	return idemtest.Case[pgx.Tx]{Sample: sample, Setup: pgSetup(balancesDDL, idem.Config[pgx.Tx]{
		Consumer: "ledger-set", Natural: true, Handler: execSQL(`UPDATE balances SET balance = 12500 WHERE account = 'acc-1'`),
	}, nil)}
}

func TestForEachConsumerPasses(t *testing.T) {
	t.Parallel()
	idemtest.ForEachConsumer(t, goodSuite(), wiredConsumers...)
}

func TestRegisterTwicePanics(t *testing.T) {
	t.Parallel()
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "registered twice") {
			t.Errorf("recovered %v, want a panic naming the duplicate", r)
		}
	}()
	s := goodSuite()
	s.Register("ledger-set", idemtest.Case[pgx.Tx]{})
}

// TestForEachConsumerFails runs a broken suite in a child test process,
// since subtests cannot fail on a fake T, and reads its verdicts.
func TestForEachConsumerFails(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a child test process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenSuiteChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEMTEST_BROKEN_SUITE=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the broken suite passed:\n%s", out)
	}
	for _, want := range []string{
		"--- PASS: TestBrokenSuiteChild/ledger-set",
		"--- FAIL: TestBrokenSuiteChild/no-sample",
		"consumer no-sample has no sample message",
		"--- FAIL: TestBrokenSuiteChild/ledger-credit/DeliverTwice",
		"balance 12500 → 25000",
		"--- FAIL: TestBrokenSuiteChild/ledger-credit/DeliverConcurrently",
		"--- FAIL: TestBrokenSuiteChild/ledger-credit/CrashAfterCommit",
		"consumer billing-invoice is wired but has no idempotency test",
		"consumer no-sample is registered but not wired",
		"consumer registered as misnamed but Setup builds ledger-set",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("child output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("child output:\n%s", out)
	}
}

func TestBrokenSuiteChild(t *testing.T) {
	if os.Getenv("IDEMTEST_BROKEN_SUITE") == "" {
		t.Skip("run by TestForEachConsumerFails")
	}
	var s idemtest.Suite[pgx.Tx]
	s.Register("ledger-credit", idemtest.Case[pgx.Tx]{Sample: sample, Setup: pgSetup(balancesDDL, falselyNatural, ignoreUpdatedAt)})
	s.Register("ledger-set", ledgerSet())
	s.Register("no-sample", idemtest.Case[pgx.Tx]{Setup: pgSetup(balancesDDL, guarded, nil)})
	s.Register("misnamed", ledgerSet())
	idemtest.ForEachConsumer(t, &s, "ledger-credit", "ledger-set", "misnamed", "billing-invoice")
}

// TestForEachConsumerSQLite runs the whole suite on SQLite, one database
// file per Setup call.
func TestForEachConsumerSQLite(t *testing.T) {
	t.Parallel()
	setup := func(tb testing.TB, faults idem.FaultFunc) (*idem.Processor[*sql.Tx], idemtest.Snapshotter) {
		db := openSQLite(tb)
		ctx := context.Background()
		store, err := sqlinbox.New(db, sqlinbox.SQLite, nil)
		if err != nil {
			tb.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			tb.Fatal(err)
		}
		for _, q := range []string{`CREATE TABLE balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL)`, `INSERT INTO balances VALUES ('acc-1', 0)`} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				tb.Fatal(err)
			}
		}
		proc, err := idem.NewProcessor(store, &idem.Config[*sql.Tx]{Consumer: "ledger-credit", Key: idem.ByMessageID, Logger: quiet, Faults: faults,
			Handler: func(ctx context.Context, tx *sql.Tx, _ idem.Message) error {
				_, err := tx.ExecContext(ctx, `UPDATE balances SET balance = balance + 12500 WHERE account = 'acc-1'`)
				return err
			}})
		if err != nil {
			tb.Fatal(err)
		}
		return proc, idemtest.SQLite(db, nil)
	}
	var s idemtest.Suite[*sql.Tx]
	s.Register("ledger-credit", idemtest.Case[*sql.Tx]{Sample: sample, Setup: setup})
	idemtest.ForEachConsumer(t, &s, "ledger-credit")
}
