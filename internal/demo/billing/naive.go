package billing

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/idem"
)

// The naive consumers are the code of the incident, kept only so that the
// demo can show what it does under redelivery. They are declared Natural,
// which is exactly their mistake: they claim an effect that is safe to
// repeat, so no inbox marker is written, while each of them adds a row, a
// balance or a charge every time it runs. Never copy them.

// Naive consumer names.
const (
	NaiveInvoicesConsumer  = "naive-invoice"
	NaiveLedgerConsumer    = "naive-ledger"
	NaiveInventoryConsumer = "naive-inventory"
)

// NaiveInvoicesConfig creates an invoice for every delivery (the table has
// no unique index either: see [MigrateNaive]) and charges the gateway
// without an idempotency key, as the incident's consumer did.
func NaiveInvoicesConfig(gw *Gateway) *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: NaiveInvoicesConsumer,
		Natural:  true,
		Handler: idem.JSON(func(ctx context.Context, tx *sql.Tx, msg idem.Message, e SubscriptionRenewed) error {
			if err := e.validate(); err != nil {
				return idem.Permanent(err)
			}
			var id int64
			if err := tx.QueryRowContext(ctx, `INSERT INTO invoices
				(customer_id, subscription_id, period, amount, status, source_message_id)
				VALUES ($1, $2, $3, $4, 'Issued', $5) RETURNING id`,
				e.CustomerID, e.SubscriptionID, e.Period, e.Amount, msg.ID).Scan(&id); err != nil {
				return fmt.Errorf("inserting invoice: %w", err)
			}
			if _, err := gw.Charge(ctx, "", e.CustomerID, e.Amount); err != nil {
				return fmt.Errorf("charging invoice %d: %w", id, err)
			}
			return nil
		}),
	}
}

// NaiveLedgerConfig credits the merchant for every delivery.
func NaiveLedgerConfig() *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: NaiveLedgerConsumer,
		Natural:  true,
		Handler: idem.JSON(func(ctx context.Context, tx *sql.Tx, msg idem.Message, e OrderPaid) error {
			if err := e.validate(); err != nil {
				return idem.Permanent(err)
			}
			return credit(ctx, tx, msg.ID, e)
		}),
	}
}

// NaiveInventoryConfig takes stock for every delivery.
func NaiveInventoryConfig() *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: NaiveInventoryConsumer,
		Natural:  true,
		Handler: idem.JSON(func(ctx context.Context, tx *sql.Tx, msg idem.Message, e OrderPlaced) error {
			if err := e.validate(); err != nil {
				return idem.Permanent(err)
			}
			return take(ctx, tx, msg.ID, e)
		}),
	}
}
