package billing

import (
	"context"
	"fmt"
	"sync"
)

// Gateway is an in-process payment gateway. Like a real one (Stripe,
// Adyen, VNPay), it honours idempotency keys: a charge repeated with a key it
// has seen returns the first charge and moves no money. A charge without a
// key always moves money. It counts what it really charged. It is safe for
// concurrent use.
type Gateway struct {
	mu       sync.Mutex
	byKey    map[string]Charge
	charges  int
	amount   int64
	replayed int
	perCust  map[string]int
}

// Charge is one charge the gateway made.
type Charge struct {
	// ID is the gateway's charge ID (ch-000001…).
	ID         string
	Key        string
	CustomerID string
	Amount     int64
	// Replayed is set when the charge was answered from an earlier charge
	// with the same idempotency key: no money moved this time.
	Replayed bool
}

// GatewayStats is what a gateway charged.
type GatewayStats struct {
	// Charges counts real charges; Amount is their total.
	Charges int   `json:"charges"`
	Amount  int64 `json:"amount"`
	// Replayed counts requests answered from an idempotency key already used.
	Replayed int `json:"replayed"`
	// CustomersChargedTwice counts customers charged more than once.
	CustomersChargedTwice int `json:"customers_charged_twice"`
}

// NewGateway returns a gateway that has charged nothing.
func NewGateway() *Gateway {
	return &Gateway{byKey: map[string]Charge{}, perCust: map[string]int{}}
}

// Charge charges amount to customer. A non-empty key makes the call
// idempotent: the same key returns the first charge.
func (g *Gateway) Charge(ctx context.Context, key, customer string, amount int64) (Charge, error) {
	if err := ctx.Err(); err != nil {
		return Charge{}, fmt.Errorf("charging %s: %w", customer, err)
	}
	if amount <= 0 {
		return Charge{}, fmt.Errorf("charging %s: amount %d must be positive", customer, amount)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if key != "" {
		if c, ok := g.byKey[key]; ok {
			g.replayed++
			c.Replayed = true
			return c, nil
		}
	}
	g.charges++
	g.amount += amount
	g.perCust[customer]++
	c := Charge{ID: fmt.Sprintf("ch-%06d", g.charges), Key: key, CustomerID: customer, Amount: amount}
	if key != "" {
		g.byKey[key] = c
	}
	return c, nil
}

// Stats returns what the gateway charged so far.
func (g *Gateway) Stats() GatewayStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := GatewayStats{Charges: g.charges, Amount: g.amount, Replayed: g.replayed}
	for _, n := range g.perCust {
		if n > 1 {
			s.CustomersChargedTwice++
		}
	}
	return s
}
