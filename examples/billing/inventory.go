package billing

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/idem"
)

// InventoryConsumer is the inventory service's consumer name.
const InventoryConsumer = "billing-inventory"

// InventoryConfig is the idem configuration of the inventory service: an
// order line leaves stock once, keyed by order and product.
func InventoryConfig() *idem.Config[*sql.Tx] { return Services{}.InventoryConfig() }

// InventoryConfig is [InventoryConfig] in the services' SQL.
func (s Services) InventoryConfig() *idem.Config[*sql.Tx] {
	return &idem.Config[*sql.Tx]{
		Consumer: InventoryConsumer,
		Key:      idem.JSONKey(StockKey),
		Handler: idem.JSON(func(ctx context.Context, tx *sql.Tx, msg idem.Message, e OrderPlaced) error {
			if err := e.validate(); err != nil {
				return idem.Permanent(err)
			}
			return s.take(ctx, tx, msg.ID, e)
		}),
	}
}

// TakeStock takes an order line's quantity out of stock and records the
// movement. An unknown product is a permanent error: the message is
// dead-lettered rather than retried forever.
func TakeStock(ctx context.Context, tx *sql.Tx, msg idem.Message, e OrderPlaced) error {
	if err := e.validate(); err != nil {
		return idem.Permanent(err)
	}
	return Services{}.take(ctx, tx, msg.ID, e)
}

// take takes the line out of stock. On MySQL the affected rows are the rows
// changed, not matched; every valid line changes its row (its quantity is
// positive), so 0 still means an unknown product.
func (s Services) take(ctx context.Context, tx *sql.Tx, msgID string, e OrderPlaced) error {
	res, err := tx.ExecContext(ctx, s.f.q(`UPDATE stock SET quantity = quantity - $1 WHERE product_id = $2`), e.Quantity, e.ProductID)
	if err != nil {
		return fmt.Errorf("taking %d of %s out of stock: %w", e.Quantity, e.ProductID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("taking %s out of stock: %w", e.ProductID, err)
	} else if n == 0 {
		return idem.Permanent(fmt.Errorf("%w: unknown product %s", ErrInvalidEvent, e.ProductID))
	}
	if _, err := tx.ExecContext(ctx, s.f.q(`INSERT INTO stock_movements (order_id, product_id, quantity, source_message_id)
		VALUES ($1, $2, $3, $4)`), e.OrderID, e.ProductID, -e.Quantity, msgID); err != nil {
		return fmt.Errorf("recording stock movement of %s: %w", e.ProductID, err)
	}
	return nil
}
