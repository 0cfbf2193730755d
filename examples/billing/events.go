package billing

import (
	"errors"
	"fmt"
)

// SubscriptionRenewed asks for the invoice of one subscription period. Amounts
// are in the currency's smallest unit (đồng).
type SubscriptionRenewed struct {
	EventID        string `json:"event_id"`
	SubscriptionID string `json:"subscription_id"`
	CustomerID     string `json:"customer_id"`
	Period         string `json:"period"` // YYYY-MM
	Amount         int64  `json:"amount"`
}

// OrderPaid credits a merchant with a paid order's amount.
type OrderPaid struct {
	EventID    string `json:"event_id"`
	OrderID    string `json:"order_id"`
	MerchantID string `json:"merchant_id"`
	Amount     int64  `json:"amount"`
}

// OrderPlaced takes one order line's quantity out of stock.
type OrderPlaced struct {
	EventID   string `json:"event_id"`
	OrderID   string `json:"order_id"`
	ProductID string `json:"product_id"`
	Quantity  int64  `json:"quantity"`
}

// ErrInvalidEvent is wrapped by the (permanent) error of an event that no
// retry can make valid.
var ErrInvalidEvent = errors.New("invalid event")

func (e SubscriptionRenewed) validate() error {
	switch {
	case e.SubscriptionID == "" || e.CustomerID == "":
		return fmt.Errorf("%w: renewal without subscription or customer", ErrInvalidEvent)
	case len(e.Period) != 7 || e.Period[4] != '-':
		return fmt.Errorf("%w: period %q is not YYYY-MM", ErrInvalidEvent, e.Period)
	case e.Amount <= 0:
		return fmt.Errorf("%w: amount %d", ErrInvalidEvent, e.Amount)
	}
	return nil
}

func (e OrderPaid) validate() error {
	if e.MerchantID == "" || e.Amount <= 0 {
		return fmt.Errorf("%w: order paid without merchant or with amount %d", ErrInvalidEvent, e.Amount)
	}
	return nil
}

func (e OrderPlaced) validate() error {
	if e.OrderID == "" || e.ProductID == "" || e.Quantity <= 0 {
		return fmt.Errorf("%w: order line without order or product, or with quantity %d", ErrInvalidEvent, e.Quantity)
	}
	return nil
}

// InvoiceKey is the business key of a renewal's effect: one invoice per
// customer and period, whatever message asks for it.
func InvoiceKey(e SubscriptionRenewed) string {
	return "invoice:" + e.CustomerID + ":" + e.Period
}

// ChargeKey is the payment gateway's idempotency key of a renewal: derived
// from the business action, not from an invoice row ID, so that even a second
// invoice row for the same renewal could never be charged twice.
func ChargeKey(e SubscriptionRenewed) string {
	return "renew-" + e.SubscriptionID + "-" + e.Period
}

// StockKey is the inbox key of an order line: the same line taken out of
// stock twice is one effect.
func StockKey(e OrderPlaced) string {
	return "stock:" + e.OrderID + ":" + e.ProductID
}
