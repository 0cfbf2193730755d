package billing

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/idem"
)

// LedgerConsumer is the ledger service's consumer name.
const LedgerConsumer = "billing-ledger"

// LedgerConfig is the idem configuration of the ledger service: each
// OrderPaid credits its merchant once, keyed by event ID (an order paid,
// refunded and paid again is three events, so the order ID would be too
// coarse a key).
func LedgerConfig() *idem.Config[*sql.Tx] { return Services{}.LedgerConfig() }

// LedgerConfig is [LedgerConfig] in the services' SQL.
func (s Services) LedgerConfig() *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: LedgerConsumer,
		Key:      idem.ByMessageID,
		Handler: idem.JSON(func(ctx context.Context, tx *sql.Tx, msg idem.Message, e OrderPaid) error {
			if err := e.validate(); err != nil {
				return idem.Permanent(err)
			}
			return s.credit(ctx, tx, msg.ID, e)
		}),
	}
}

// CreditMerchant adds the order's amount to its merchant's balance and keeps
// the event ID on the ledger entry, the reference reconciliation works from.
func CreditMerchant(ctx context.Context, tx *sql.Tx, msg idem.Message, e OrderPaid) error {
	if err := e.validate(); err != nil {
		return idem.Permanent(err)
	}
	return Services{}.credit(ctx, tx, msg.ID, e)
}

func (s Services) credit(ctx context.Context, tx *sql.Tx, eventID string, e OrderPaid) error {
	if _, err := tx.ExecContext(ctx, s.f.q(`INSERT INTO ledger_entries (event_id, merchant_id, amount)
		VALUES ($1, $2, $3)`), eventID, e.MerchantID, e.Amount); err != nil {
		return fmt.Errorf("writing ledger entry of %s: %w", eventID, err)
	}
	q := `INSERT INTO merchant_balances (merchant_id, balance) VALUES ($1, $2)
		ON CONFLICT (merchant_id) DO UPDATE SET balance = merchant_balances.balance + excluded.balance`
	if s.f.mysql {
		q = `INSERT INTO merchant_balances (merchant_id, balance) VALUES (?, ?)
		ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance)`
	}
	if _, err := tx.ExecContext(ctx, q, e.MerchantID, e.Amount); err != nil {
		return fmt.Errorf("crediting merchant %s: %w", e.MerchantID, err)
	}
	return nil
}
