package billing

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/idem"
)

// StatsConsumer is the stats service's consumer name.
const StatsConsumer = "billing-stats"

// StatsConfig is the idem configuration of the stats service. Its effect is a
// recompute, naturally idempotent: it writes no inbox marker, yet runs in a
// transaction with the same ack and dead-letter discipline as the others. The
// incident's stats consumer added each amount to a running total and was
// wrong after every redelivery; recomputing from the source rows cannot be.
func StatsConfig() *idem.Config[*sql.Tx] { return Services{}.StatsConfig() }

// StatsConfig is [StatsConfig] in the services' SQL.
func (s Services) StatsConfig() *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: StatsConsumer,
		Natural:  true,
		Handler:  idem.JSON(s.recomputeRevenue),
	}
}

// RecomputeRevenue sets the renewal's month revenue to the sum of the month's
// live invoices.
func RecomputeRevenue(ctx context.Context, tx *sql.Tx, msg idem.Message, e SubscriptionRenewed) error {
	return Services{}.recomputeRevenue(ctx, tx, msg, e)
}

func (s Services) recomputeRevenue(ctx context.Context, tx *sql.Tx, _ idem.Message, e SubscriptionRenewed) error {
	if err := e.validate(); err != nil {
		return idem.Permanent(err)
	}
	q, args := `INSERT INTO revenue_monthly (period, invoices, total)
		SELECT $1, COUNT(*), COALESCE(SUM(amount), 0) FROM invoices
		WHERE period = $1 AND status <> 'VoidedDuplicate'
		ON CONFLICT (period) DO UPDATE SET invoices = excluded.invoices, total = excluded.total`, []any{e.Period}
	if s.f.mysql {
		q, args = `INSERT INTO revenue_monthly (period, invoices, total)
		SELECT ?, COUNT(*), COALESCE(SUM(amount), 0) FROM invoices
		WHERE period = ? AND status <> 'VoidedDuplicate'
		ON DUPLICATE KEY UPDATE invoices = VALUES(invoices), total = VALUES(total)`, []any{e.Period, e.Period}
	}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("recomputing revenue of %s: %w", e.Period, err)
	}
	return nil
}

// Consumers returns the configuration of every billing consumer, as a
// service wires them. Tests take the list of consumer names from here, so a
// consumer added to the service without an idempotency test fails them.
func Consumers() []*idem.Config[*sql.Tx] { return Services{}.Consumers() }

// Consumers is [Consumers] in the services' SQL.
func (s Services) Consumers() []*idem.Config[*sql.Tx] {
	return []*idem.Config[*sql.Tx]{s.InvoicesConfig(), s.LedgerConfig(), s.InventoryConfig(), s.StatsConfig()}
}
