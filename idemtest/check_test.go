package idemtest_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

var ignoreUpdatedAt = &idemtest.SnapshotOptions{Ignore: []string{"updated_at"}}

// guarded adds to the balance behind an inbox claim: idempotent.
var guarded = idem.Config[pgx.Tx]{Consumer: "ledger-credit", Key: idem.ByMessageID, Handler: execSQL(addToBalance)}

// falselyNatural adds to the balance and claims to be naturally idempotent,
// which it is not: no marker guards the increment.
var falselyNatural = idem.Config[pgx.Tx]{Consumer: "ledger-credit", Natural: true, Handler: execSQL(addToBalance)}

func TestDeliverTwiceCatchesFalseNaturalClaim(t *testing.T) {
	t.Parallel()
	setup := pgSetup(balancesDDL, falselyNatural, ignoreUpdatedAt)
	out := mustFail(t, func(tb testing.TB) {
		proc, snap := setup(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap)
	}, "ledger-credit is not idempotent", "balances row account=acc-1", "balance 12500 → 25000", "evt-1")
	if strings.Contains(out, "updated_at") {
		t.Errorf("ignored column updated_at shows in the failure:\n%s", out)
	}
}

func TestDeliverTwicePassesGuardedConsumer(t *testing.T) {
	t.Parallel()
	setup := pgSetup(balancesDDL, guarded, nil)
	mustPass(t, func(tb testing.TB) {
		proc, snap := setup(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap)
	})
}

func TestDeliverTwicePassesTrueNaturalConsumer(t *testing.T) {
	t.Parallel()
	setter := idem.Config[pgx.Tx]{Consumer: "ledger-set", Natural: true,
		Handler: execSQL(`UPDATE balances SET balance = 12500 WHERE account = 'acc-1'`)}
	setup := pgSetup(balancesDDL, setter, nil)
	mustPass(t, func(tb testing.TB) {
		proc, snap := setup(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap)
	})
}

func TestDeliverTwiceRequiresAnEffect(t *testing.T) {
	t.Parallel()
	idle := idem.Config[pgx.Tx]{Consumer: "idle", Key: idem.ByMessageID,
		Handler: func(context.Context, pgx.Tx, idem.Message) error { return nil }}
	setup := pgSetup(balancesDDL, idle, nil)
	mustFail(t, func(tb testing.TB) {
		proc, snap := setup(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap)
	}, "changed nothing", "proves nothing", "AllowNoEffect")
	mustPass(t, func(tb testing.TB) {
		proc, snap := setup(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap, idemtest.AllowNoEffect())
	})
}

func TestDeliverTwiceCatchesUnstableKey(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	unstable := guarded
	unstable.Key = func(m idem.Message) (string, error) {
		// A key that includes something a redelivery changes, like a
		// consumer-generated ID or the receive time.
		return m.ID + "-" + time.Now().Format(time.RFC3339Nano) + string(rune('a'+n.Add(1))), nil
	}
	setup := pgSetup(balancesDDL, unstable, nil)
	mustFail(t, func(tb testing.TB) {
		proc, snap := setup(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap)
	}, "did not recognise", "key func stable", "balance 12500 → 25000")
}

func TestDeliverTwiceStopsOnFailedFirstDelivery(t *testing.T) {
	t.Parallel()
	broken := guarded
	broken.Handler = execSQL(`UPDATE no_such_table SET x = 1`)
	setup := pgSetup(balancesDDL, broken, nil)
	f := observe(t, func(tb testing.TB) {
		proc, snap := setup(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap)
	})
	if !f.fatal || !strings.Contains(f.output(), "want applied") || !strings.Contains(f.output(), "no_such_table") {
		t.Fatalf("want a fatal failure naming the error; fatal=%v:\n%s", f.fatal, f.output())
	}
}

func TestDeliverConcurrentlyPassesGuardedConsumer(t *testing.T) {
	t.Parallel()
	mustPass(t, func(tb testing.TB) {
		idemtest.DeliverConcurrently(tb, pgSetup(balancesDDL, guarded, nil), sample, 4)
	})
}

const invoicesDDL = `CREATE TABLE invoices (id bigserial PRIMARY KEY, customer text NOT NULL, period text NOT NULL, amount bigint NOT NULL)`

// checkThenAct returns a Setup for a "natural" consumer that looks for the
// invoice first and inserts it if absent: right when deliveries come one by
// one, wrong when they race. In the database built for the race (the third
// call: DeliverConcurrently builds two reference databases first), each
// handler waits after its check until all n have checked, so the race
// happens on every run instead of now and then.
func checkThenAct(n int) idemtest.Setup[pgx.Tx] {
	var calls atomic.Int64
	return func(t testing.TB, faults idem.FaultFunc) (*idem.Processor[pgx.Tx], idemtest.Snapshotter) {
		var barrier *sync.WaitGroup
		if calls.Add(1) == 3 {
			barrier = &sync.WaitGroup{}
			barrier.Add(n)
		}
		cfg := idem.Config[pgx.Tx]{Consumer: "billing-invoice", Natural: true,
			Handler: func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
				var exists bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM invoices WHERE customer = 'cus-8421' AND period = '2026-09')`).Scan(&exists); err != nil {
					return err
				}
				if barrier != nil {
					barrier.Done()
					waitOrTimeout(barrier, 5*time.Second)
				}
				if exists {
					return nil
				}
				_, err := tx.Exec(ctx, `INSERT INTO invoices (customer, period, amount) VALUES ('cus-8421', '2026-09', 2400000)`)
				return err
			}}
		return pgSetup(invoicesDDL, cfg, nil)(t, faults)
	}
}

func waitOrTimeout(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

func TestDeliverConcurrentlyCatchesCheckThenAct(t *testing.T) {
	t.Parallel()
	const n = 4 // at most the pool's connections, or the barrier starves
	mustFail(t, func(tb testing.TB) {
		idemtest.DeliverConcurrently(tb, checkThenAct(n), sample, n)
	}, "billing-invoice", "invoices: one delivery adds 1 row, these added 4 rows")
	// The same consumer passes the sequential check: only the race shows it.
	mustPass(t, func(tb testing.TB) {
		proc, snap := checkThenAct(n)(tb, nil)
		idemtest.DeliverTwice(tb, proc, sample, snap)
	})
}

func TestDeliverConcurrentlyCatchesRacingIncrement(t *testing.T) {
	t.Parallel()
	mustFail(t, func(tb testing.TB) {
		idemtest.DeliverConcurrently(tb, pgSetup(balancesDDL, falselyNatural, ignoreUpdatedAt), sample, 3)
	}, "balances row account=acc-1: one delivery leaves balance=12500, these left balance=37500")
}

func TestDeliverConcurrentlyNeedsFreshDatabases(t *testing.T) {
	t.Parallel()
	setup := pgSetup(balancesDDL, guarded, nil)
	var once sync.Once
	var proc *idem.Processor[pgx.Tx]
	var snap idemtest.Snapshotter
	shared := func(tb testing.TB, faults idem.FaultFunc) (*idem.Processor[pgx.Tx], idemtest.Snapshotter) {
		once.Do(func() { proc, snap = setup(tb, faults) })
		return proc, snap
	}
	mustFail(t, func(tb testing.TB) {
		idemtest.DeliverConcurrently(tb, shared, sample, 2)
	}, "fresh database", "balance 0 → 12500")
}

func TestCrashAfterCommit(t *testing.T) {
	t.Parallel()
	t.Run("guarded passes", func(t *testing.T) {
		t.Parallel()
		mustPass(t, func(tb testing.TB) {
			idemtest.CrashAfterCommit(tb, pgSetup(balancesDDL, guarded, nil), sample)
		})
	})
	t.Run("falsely natural fails", func(t *testing.T) {
		t.Parallel()
		mustFail(t, func(tb testing.TB) {
			idemtest.CrashAfterCommit(tb, pgSetup(balancesDDL, falselyNatural, ignoreUpdatedAt), sample)
		}, "not idempotent", "redelivery after the crash", "balance 12500 → 25000")
	})
	t.Run("setup that drops faults fails", func(t *testing.T) {
		t.Parallel()
		setup := pgSetup(balancesDDL, guarded, nil)
		deaf := func(tb testing.TB, _ idem.FaultFunc) (*idem.Processor[pgx.Tx], idemtest.Snapshotter) {
			return setup(tb, nil)
		}
		mustFail(t, func(tb testing.TB) {
			idemtest.CrashAfterCommit(tb, deaf, sample)
		}, "never reached idem.AfterCommit", "idem.Config.Faults")
	})
}
