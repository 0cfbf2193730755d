package billing_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"regexp"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/mysqlinbox"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// env is one real database with the billing tables and an inbox.
type env struct {
	db    *sql.DB
	d     sqlinbox.Dialect
	svc   billing.Services // the services in d's SQL
	store *sqlinbox.Store
	snap  idemtest.Snapshotter
}

// databases runs f on SQLite, on PostgreSQL and on MySQL (MariaDB here),
// each on a fresh database.
func databases(t *testing.T, f func(t *testing.T, open func(t *testing.T, naive bool) *env)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, func(t *testing.T, naive bool) *env {
			db, err := sqliteinbox.Open(filepath.Join(t.TempDir(), "billing.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			return setup(t, db, sqlinbox.SQLite, naive, idemtest.SQLite(db, nil))
		})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, func(t *testing.T, naive bool) *env {
			db, err := sql.Open("pgx", pgtest.Schema(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			return setup(t, db, sqlinbox.Postgres, naive, idemtest.PostgresSQL(db, nil))
		})
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		f(t, func(t *testing.T, naive bool) *env {
			db, err := mysqlinbox.Open(mysqltest.Database(t, "idem_billing_").FormatDSN())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			d, err := mysqlinbox.Detect(t.Context(), db)
			if err != nil {
				t.Fatal(err)
			}
			return setup(t, db, d, naive, idemtest.MySQL(db, nil))
		})
	})
}

func setup(t testing.TB, db *sql.DB, d sqlinbox.Dialect, naive bool, snap idemtest.Snapshotter) *env {
	t.Helper()
	ctx := t.Context()
	store, err := sqlinbox.New(db, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatalf("migrating inbox: %v", err)
	}
	migrate := billing.Migrate
	if naive {
		migrate = billing.MigrateNaive
	}
	if err := migrate(ctx, db, d); err != nil {
		t.Fatal(err)
	}
	if err := billing.For(d).SeedStock(ctx, db, map[string]int64{"sku-1": 100}); err != nil {
		t.Fatal(err)
	}
	return &env{db: db, d: d, svc: billing.For(d), store: store, snap: snap}
}

func (e *env) processor(t *testing.T, cfg *idem.Config[*sql.Tx]) *idem.Processor[*sql.Tx] {
	t.Helper()
	p, err := idem.NewProcessor(e.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) count(t *testing.T, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if e.svc != billing.For(nil) {
		query = regexp.MustCompile(`\$[0-9]+`).ReplaceAllString(query, "?")
	}
	if err := e.db.QueryRowContext(t.Context(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func message(t *testing.T, id string, v any) idem.Message {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return idem.Message{ID: id, Source: "test", Body: b}
}

var renewal = billing.SubscriptionRenewed{
	EventID: "msg-7f3a", SubscriptionID: "sub-8421", CustomerID: "cus-8421", Period: "2026-03", Amount: 5_000_000,
}

func TestInvoicesDeliveredTwice(t *testing.T) {
	databases(t, func(t *testing.T, open func(*testing.T, bool) *env) {
		e := open(t, false)
		msg := message(t, renewal.EventID, renewal)
		idemtest.DeliverTwice(t, e.processor(t, e.svc.InvoicesConfig()), msg, e.snap)
		if n := e.count(t, `SELECT COUNT(*) FROM invoices WHERE customer_id = $1 AND period = $2 AND source_message_id = $3`,
			renewal.CustomerID, renewal.Period, renewal.EventID); n != 1 {
			t.Errorf("invoices of %s %s recording %s: %d, want 1", renewal.CustomerID, renewal.Period, renewal.EventID, n)
		}
		if n := e.count(t, `SELECT COUNT(*) FROM charge_outbox WHERE idempotency_key = $1`, "renew-sub-8421-2026-03"); n != 1 {
			t.Errorf("queued charges with key renew-sub-8421-2026-03: %d, want 1", n)
		}
	})
}

// A second message with another ID for the same renewal (a producer that
// published twice) is caught by the business key.
func TestInvoicesSameRenewalTwoMessageIDs(t *testing.T) {
	databases(t, func(t *testing.T, open func(*testing.T, bool) *env) {
		e := open(t, false)
		p := e.processor(t, e.svc.InvoicesConfig())
		r1 := p.Process(t.Context(), message(t, "msg-1", renewal))
		r2 := p.Process(t.Context(), message(t, "msg-2", renewal))
		if r1.Outcome != idem.Applied || r2.Outcome != idem.Duplicate {
			t.Fatalf("outcomes %v, %v; want applied, duplicate (errors %v, %v)", r1.Outcome, r2.Outcome, r1.Err, r2.Err)
		}
		if n := e.count(t, `SELECT COUNT(*) FROM invoices`); n != 1 {
			t.Errorf("invoices: %d, want 1", n)
		}
	})
}

// The partial unique index is the last line: an invoice written by another
// path (here, with no inbox marker) makes the consumer write and charge
// nothing, while a voided duplicate does not block a new invoice.
func TestInvoicesUniqueIndexGuards(t *testing.T) {
	databases(t, func(t *testing.T, open func(*testing.T, bool) *env) {
		e := open(t, false)
		ctx := t.Context()
		if _, err := e.db.ExecContext(ctx, `INSERT INTO invoices (customer_id, subscription_id, period, amount, source_message_id)
			VALUES ('cus-8421', 'sub-8421', '2026-03', 5000000, 'elsewhere')`); err != nil {
			t.Fatal(err)
		}
		_, err := e.db.ExecContext(ctx, `INSERT INTO invoices (customer_id, subscription_id, period, amount, source_message_id)
			VALUES ('cus-8421', 'sub-8421', '2026-03', 5000000, 'again')`)
		if err == nil {
			t.Fatal("a second live invoice for cus-8421 2026-03 was accepted; the unique index is missing")
		}
		r := e.processor(t, e.svc.InvoicesConfig()).Process(ctx, message(t, "msg-1", renewal))
		if r.Outcome != idem.Applied {
			t.Fatalf("outcome %v (%v), want applied", r.Outcome, r.Err)
		}
		if n := e.count(t, `SELECT COUNT(*) FROM invoices`); n != 1 {
			t.Errorf("invoices: %d, want 1", n)
		}
		if n := e.count(t, `SELECT COUNT(*) FROM charge_outbox`); n != 0 {
			t.Errorf("queued charges: %d, want 0", n)
		}
		if _, err := e.db.ExecContext(ctx, `UPDATE invoices SET status = 'VoidedDuplicate'`); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.ExecContext(ctx, `INSERT INTO invoices (customer_id, subscription_id, period, amount, source_message_id)
			VALUES ('cus-8421', 'sub-8421', '2026-03', 5000000, 'after-void')`); err != nil {
			t.Errorf("a voided invoice blocks a new one: %v", err)
		}
	})
}

func TestLedgerDeliveredTwice(t *testing.T) {
	databases(t, func(t *testing.T, open func(*testing.T, bool) *env) {
		e := open(t, false)
		paid := billing.OrderPaid{EventID: "evt-1", OrderID: "ord-1", MerchantID: "mer-1", Amount: 12_500}
		idemtest.DeliverTwice(t, e.processor(t, e.svc.LedgerConfig()), message(t, paid.EventID, paid), e.snap)
		if n := e.count(t, `SELECT balance FROM merchant_balances WHERE merchant_id = 'mer-1'`); n != 12_500 {
			t.Errorf("balance of mer-1: %d, want 12500", n)
		}
	})
}

func TestInventoryDeliveredTwice(t *testing.T) {
	databases(t, func(t *testing.T, open func(*testing.T, bool) *env) {
		e := open(t, false)
		line := billing.OrderPlaced{EventID: "evt-2", OrderID: "ord-1", ProductID: "sku-1", Quantity: 3}
		idemtest.DeliverTwice(t, e.processor(t, e.svc.InventoryConfig()), message(t, line.EventID, line), e.snap)
		if n := e.count(t, `SELECT quantity FROM stock WHERE product_id = 'sku-1'`); n != 97 {
			t.Errorf("stock of sku-1: %d, want 97", n)
		}
		r := e.processor(t, e.svc.InventoryConfig()).Process(t.Context(),
			message(t, "evt-3", billing.OrderPlaced{EventID: "evt-3", OrderID: "ord-2", ProductID: "sku-404", Quantity: 1}))
		if r.Outcome != idem.DeadLettered || !errors.Is(r.Err, billing.ErrInvalidEvent) {
			t.Errorf("unknown product: outcome %v (%v), want dead_lettered with ErrInvalidEvent", r.Outcome, r.Err)
		}
	})
}

func TestStatsDeliveredTwice(t *testing.T) {
	databases(t, func(t *testing.T, open func(*testing.T, bool) *env) {
		e := open(t, false)
		if r := e.processor(t, e.svc.InvoicesConfig()).Process(t.Context(), message(t, renewal.EventID, renewal)); r.Outcome != idem.Applied {
			t.Fatalf("invoice: %v (%v)", r.Outcome, r.Err)
		}
		idemtest.DeliverTwice(t, e.processor(t, e.svc.StatsConfig()), message(t, renewal.EventID, renewal), e.snap)
		if n := e.count(t, `SELECT total FROM revenue_monthly WHERE period = '2026-03'`); n != 5_000_000 {
			t.Errorf("revenue of 2026-03: %d, want 5000000", n)
		}
	})
}

// The naive consumers are what the demo shows failing: pin that they do.
func TestNaiveConsumersApplyTwice(t *testing.T) {
	databases(t, func(t *testing.T, open func(*testing.T, bool) *env) {
		e := open(t, true)
		ctx := t.Context()
		gw := billing.NewGateway()
		inv := e.processor(t, e.svc.NaiveInvoicesConfig(gw))
		led := e.processor(t, e.svc.NaiveLedgerConfig())
		paid := billing.OrderPaid{EventID: "evt-1", OrderID: "ord-1", MerchantID: "mer-1", Amount: 12_500}
		for range 2 {
			inv.Process(ctx, message(t, renewal.EventID, renewal))
			led.Process(ctx, message(t, paid.EventID, paid))
		}
		if n := e.count(t, `SELECT COUNT(*) FROM invoices`); n != 2 {
			t.Errorf("naive invoices after two deliveries: %d, want 2", n)
		}
		if s := gw.Stats(); s.Charges != 2 || s.CustomersChargedTwice != 1 {
			t.Errorf("naive charges: %+v, want 2 charges to one customer", s)
		}
		if n := e.count(t, `SELECT balance FROM merchant_balances`); n != 25_000 {
			t.Errorf("naive balance after two deliveries: %d, want 25000 (the incident's example)", n)
		}
	})
}

// The relay is at least once; the idempotency key keeps a resent charge
// from moving money twice.
func TestChargeRelayResendIsReplayed(t *testing.T) {
	databases(t, func(t *testing.T, open func(*testing.T, bool) *env) {
		e := open(t, false)
		ctx := t.Context()
		if r := e.processor(t, e.svc.InvoicesConfig()).Process(ctx, message(t, renewal.EventID, renewal)); r.Outcome != idem.Applied {
			t.Fatalf("invoice: %v (%v)", r.Outcome, r.Err)
		}
		gw := billing.NewGateway()
		crash := true
		relay := &billing.ChargeRelay{DB: e.db, Dialect: e.d, Gateway: gw, BeforeMark: func(int) error {
			if crash {
				crash = false
				return errors.New("relay killed")
			}
			return nil
		}}
		if _, err := relay.SendPending(ctx); err == nil {
			t.Fatal("the crashed pass reported no error")
		}
		if n, err := relay.SendPending(ctx); err != nil || n != 1 {
			t.Fatalf("second pass: %d, %v; want 1 sent", n, err)
		}
		if n, err := relay.SendPending(ctx); err != nil || n != 0 {
			t.Fatalf("third pass: %d, %v; want nothing left", n, err)
		}
		if s := gw.Stats(); s.Charges != 1 || s.Replayed != 1 || s.Amount != 5_000_000 {
			t.Errorf("gateway: %+v, want 1 charge of 5000000 and 1 replay", s)
		}
		if n := e.count(t, `SELECT COUNT(*) FROM charge_outbox WHERE charge_id = 'ch-000001'`); n != 1 {
			t.Errorf("outbox rows marked with the first charge: %d, want 1", n)
		}
	})
}

func TestGatewayHonoursKeys(t *testing.T) {
	gw := billing.NewGateway()
	ctx := context.Background()
	a, _ := gw.Charge(ctx, "renew-sub-1-2026-03", "cus-1", 100)
	b, _ := gw.Charge(ctx, "renew-sub-1-2026-03", "cus-1", 100)
	if a.ID != b.ID || !b.Replayed || a.Replayed {
		t.Errorf("same key: %+v then %+v; want the first charge replayed", a, b)
	}
	_, _ = gw.Charge(ctx, "", "cus-2", 100)
	_, _ = gw.Charge(ctx, "", "cus-2", 100)
	if s := gw.Stats(); s.Charges != 3 || s.Replayed != 1 || s.CustomersChargedTwice != 1 || s.Amount != 300 {
		t.Errorf("stats %+v; want 3 charges, 1 replay, 1 customer charged twice, 300", s)
	}
	if _, err := gw.Charge(ctx, "k", "cus-3", 0); err == nil {
		t.Error("a zero charge was accepted")
	}
}
