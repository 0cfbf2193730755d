package billing_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing"
	"github.com/idemkit/idem/sqlinbox"
	"github.com/idemkit/idem/sqliteinbox"
)

// openBilling opens a fresh database in a temporary directory with the
// inbox and the services' tables; done closes and removes it.
func openBilling(ctx context.Context) (db *sql.DB, store *sqlinbox.Store, done func()) {
	dir, err := os.MkdirTemp("", "billing-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err = sqliteinbox.Open(filepath.Join(dir, "billing.db"))
	if err != nil {
		log.Fatal(err)
	}
	store, err = sqlinbox.New(db, sqlinbox.SQLite, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := billing.Migrate(ctx, db, sqlinbox.SQLite); err != nil {
		log.Fatal(err)
	}
	return db, store, func() {
		db.Close()
		os.RemoveAll(dir)
	}
}

// The invoices service gets one renewal three times: delivered, delivered
// again after a broker restart, and republished by the producer under a new
// event ID. Its inbox key is the business key invoice:<customer>:<period>,
// so the third copy is a duplicate too. The charge leaves through the
// outbox, with an idempotency key, after the commit.
func Example_invoices() {
	ctx := context.Background()
	db, store, done := openBilling(ctx)
	defer done()

	cfg := billing.InvoicesConfig()
	cfg.Logger = slog.New(slog.DiscardHandler)
	invoices, err := idem.NewProcessor(store, cfg)
	if err != nil {
		log.Fatal(err)
	}
	renewal := func(eventID string) idem.Message {
		return idem.Message{ID: eventID, Body: fmt.Appendf(nil,
			`{"event_id":%q,"subscription_id":"sub-7","customer_id":"cus-7","period":"2026-11","amount":199000}`, eventID)}
	}
	for _, m := range []idem.Message{renewal("evt-1"), renewal("evt-1"), renewal("evt-1-again")} {
		fmt.Println(m.ID, invoices.Process(ctx, m).Outcome)
	}

	gateway := billing.NewGateway()
	relay := &billing.ChargeRelay{DB: db, Gateway: gateway}
	if _, err := relay.SendPending(ctx); err != nil {
		log.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM invoices WHERE customer_id = 'cus-7'`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoices:", n, "charges:", gateway.Stats().Charges)
	// Output:
	// evt-1 applied
	// evt-1 duplicate
	// evt-1-again duplicate
	// invoices: 1 charges: 1
}

// The ledger credits a merchant with a paid order; the payment redelivered
// after a lost ack is skipped, and the balance moves once.
func Example_ledger() {
	ctx := context.Background()
	db, store, done := openBilling(ctx)
	defer done()

	cfg := billing.LedgerConfig()
	cfg.Logger = slog.New(slog.DiscardHandler)
	ledger, err := idem.NewProcessor(store, cfg)
	if err != nil {
		log.Fatal(err)
	}
	paid := idem.Message{ID: "evt-9", Body: []byte(`{"event_id":"evt-9","order_id":"ord-9","merchant_id":"m-1","amount":12500}`)}
	fmt.Println(ledger.Process(ctx, paid).Outcome, ledger.Process(ctx, paid).Outcome)

	var balance int64
	if err := db.QueryRowContext(ctx, `SELECT balance FROM merchant_balances WHERE merchant_id = 'm-1'`).Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", balance)
	// Output:
	// applied duplicate
	// balance: 12500
}
