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
// two IDs) also cause one invoice. Set Observer, Logger or Retry on the copy
// it returns as needed.
func InvoicesConfig() *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: InvoicesConsumer,
		Key:      idem.JSONKey(InvoiceKey),
		Handler:  idem.JSON(CreateInvoice),
	}
}

// CreateInvoice writes the invoice of a renewal and queues its charge, in tx,
// the transaction holding the inbox claim. The insert names the partial unique
// index as its conflict target: should an invoice for the customer and period
// exist anyway (written by another path, or before the inbox existed), nothing
// is written and nothing is charged, and the message counts as handled, which
// is what the source documents' catch of the unique violation does, without
// aborting the transaction on PostgreSQL.
func CreateInvoice(ctx context.Context, tx *sql.Tx, msg idem.Message, e SubscriptionRenewed) error {
	if err := e.validate(); err != nil {
		return idem.Permanent(err)
	}
	var id int64
	err := tx.QueryRowContext(ctx, `INSERT INTO invoices
		(customer_id, subscription_id, period, amount, status, source_message_id)
		VALUES ($1, $2, $3, $4, 'Issued', $5)
		ON CONFLICT (customer_id, period) WHERE status <> 'VoidedDuplicate' DO NOTHING
		RETURNING id`,
		e.CustomerID, e.SubscriptionID, e.Period, e.Amount, msg.ID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inserting invoice of %s %s: %w", e.CustomerID, e.Period, err)
	}
	// The charge is a row, not a call: it commits or vanishes with the
	// invoice, and the relay sends it only once it is durable.
	if _, err := tx.ExecContext(ctx, `INSERT INTO charge_outbox
		(idempotency_key, invoice_id, customer_id, amount) VALUES ($1, $2, $3, $4)
		ON CONFLICT (idempotency_key) DO NOTHING`,
		ChargeKey(e), id, e.CustomerID, e.Amount); err != nil {
		return fmt.Errorf("queueing charge of invoice %d: %w", id, err)
	}
	return nil
}
