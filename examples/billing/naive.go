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
	return Services{}.NaiveInvoicesConfig(gw)
}

// NaiveInvoicesConfig is [NaiveInvoicesConfig] in the services' SQL.
func (s Services) NaiveInvoicesConfig(gw *Gateway) *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: NaiveInvoicesConsumer,
		Natural:  true,
		Handler: idem.JSON(func(ctx context.Context, tx *sql.Tx, msg idem.Message, e SubscriptionRenewed) error {
			if err := e.validate(); err != nil {
				return idem.Permanent(err)
			}
			id, err := s.insertNaiveInvoice(ctx, tx, msg, e)
			if err != nil {
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
func NaiveLedgerConfig() *idem.Config[*sql.Tx] { return Services{}.NaiveLedgerConfig() }

// NaiveLedgerConfig is [NaiveLedgerConfig] in the services' SQL.
func (s Services) NaiveLedgerConfig() *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: NaiveLedgerConsumer,
		Natural:  true,
		Handler: idem.JSON(func(ctx context.Context, tx *sql.Tx, msg idem.Message, e OrderPaid) error {
			if err := e.validate(); err != nil {
				return idem.Permanent(err)
			}
			return s.credit(ctx, tx, msg.ID, e)
		}),
	}
}

// NaiveInventoryConfig takes stock for every delivery.
func NaiveInventoryConfig() *idem.Config[*sql.Tx] { return Services{}.NaiveInventoryConfig() }

// NaiveInventoryConfig is [NaiveInventoryConfig] in the services' SQL.
func (s Services) NaiveInventoryConfig() *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: NaiveInventoryConsumer,
		Natural:  true,
		Handler: idem.JSON(func(ctx context.Context, tx *sql.Tx, msg idem.Message, e OrderPlaced) error {
			if err := e.validate(); err != nil {
				return idem.Permanent(err)
			}
			return s.take(ctx, tx, msg.ID, e)
		}),
	}
}

// insertNaiveInvoice inserts an invoice whatever exists, and returns its id.
func (s Services) insertNaiveInvoice(ctx context.Context, tx *sql.Tx, msg idem.Message, e SubscriptionRenewed) (int64, error) {
	if s.f.mysql {
		res, err := tx.ExecContext(ctx, `INSERT INTO invoices
			(customer_id, subscription_id, period, amount, status, source_message_id)
			VALUES (?, ?, ?, ?, 'Issued', ?)`,
			e.CustomerID, e.SubscriptionID, e.Period, e.Amount, msg.ID)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	var id int64
	err := tx.QueryRowContext(ctx, `INSERT INTO invoices
		(customer_id, subscription_id, period, amount, status, source_message_id)
		VALUES ($1, $2, $3, $4, 'Issued', $5) RETURNING id`,
		e.CustomerID, e.SubscriptionID, e.Period, e.Amount, msg.ID).Scan(&id)
	return id, err
}
