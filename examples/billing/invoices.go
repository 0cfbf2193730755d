package billing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemkit/idem"
)

// InvoicesConsumer is the invoices service's consumer name, the one of the
// incident.
const InvoicesConsumer = "billing-invoice"

// InvoicesConfig is the idem configuration of the invoices service. Its key
// is the business key invoice:<customer>:<period>, so that two different
// messages asking for the same invoice (a producer that published twice with
// two IDs) also cause one invoice. Set Hooks, Logger or Retry on the copy
// it returns as needed.
func InvoicesConfig() *idem.Config[*sql.Tx] { return Services{}.InvoicesConfig() }

// InvoicesConfig is [InvoicesConfig] in the services' SQL.
func (s Services) InvoicesConfig() *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: InvoicesConsumer,
		Key:      idem.JSONKey(InvoiceKey),
		Handler:  idem.JSON(s.createInvoice),
	}
}

// CreateInvoice writes the invoice of a renewal and queues its charge, in tx,
// the transaction holding the inbox claim. The insert names the partial unique
// index as its conflict target: should an invoice for the customer and period
// exist anyway (written by another path, or before the inbox existed), nothing
// is written and nothing is charged, and the message counts as handled, which
// is what the incident's catch of the unique violation does, without
// aborting the transaction on PostgreSQL. On MySQL the unique index on the
// key and the live column is the conflict (ON DUPLICATE KEY UPDATE that
// changes nothing: no row affected).
func CreateInvoice(ctx context.Context, tx *sql.Tx, msg idem.Message, e SubscriptionRenewed) error {
	return Services{}.createInvoice(ctx, tx, msg, e)
}

func (s Services) createInvoice(ctx context.Context, tx *sql.Tx, msg idem.Message, e SubscriptionRenewed) error {
	if err := e.validate(); err != nil {
		return idem.Permanent(err)
	}
	id, inserted, err := s.insertInvoice(ctx, tx, msg, e)
	if err != nil {
		return fmt.Errorf("inserting invoice of %s %s: %w", e.CustomerID, e.Period, err)
	}
	if !inserted {
		return nil
	}
	// The charge is a row, not a call: it commits or vanishes with the
	// invoice, and the relay sends it only once it is durable.
	q := `INSERT INTO charge_outbox
		(idempotency_key, invoice_id, customer_id, amount) VALUES ($1, $2, $3, $4)
		ON CONFLICT (idempotency_key) DO NOTHING`
	if s.f.mysql {
		q = `INSERT INTO charge_outbox (idempotency_key, invoice_id, customer_id, amount) VALUES (?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE idempotency_key = idempotency_key`
	}
	if _, err := tx.ExecContext(ctx, q, ChargeKey(e), id, e.CustomerID, e.Amount); err != nil {
		return fmt.Errorf("queueing charge of invoice %d: %w", id, err)
	}
	return nil
}

// insertInvoice inserts the renewal's invoice unless a live one exists for
// its customer and period, and returns its id.
func (s Services) insertInvoice(ctx context.Context, tx *sql.Tx, msg idem.Message, e SubscriptionRenewed) (id int64, inserted bool, err error) {
	if s.f.mysql {
		res, err := tx.ExecContext(ctx, `INSERT INTO invoices
		(customer_id, subscription_id, period, amount, status, source_message_id)
		VALUES (?, ?, ?, ?, 'Issued', ?) ON DUPLICATE KEY UPDATE id = id`,
			e.CustomerID, e.SubscriptionID, e.Period, e.Amount, msg.ID)
		if err != nil {
			return 0, false, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return 0, false, err
		}
		id, err = res.LastInsertId()
		return id, err == nil, err
	}
	err = tx.QueryRowContext(ctx, `INSERT INTO invoices
		(customer_id, subscription_id, period, amount, status, source_message_id)
		VALUES ($1, $2, $3, $4, 'Issued', $5)
		ON CONFLICT (customer_id, period) WHERE status <> 'VoidedDuplicate' DO NOTHING
		RETURNING id`,
		e.CustomerID, e.SubscriptionID, e.Period, e.Amount, msg.ID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return id, err == nil, err
}
