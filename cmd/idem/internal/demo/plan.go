package demo

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/idemkit/idem/examples/billing"
)

// Streams of the scenario, one per event type. Brokers prefix them.
const (
	streamRenewals = "renewals"
	streamPaid     = "orders-paid"
	streamPlaced   = "orders-placed"
)

var streams = []string{streamRenewals, streamPaid, streamPlaced}

// event is one message as the producer publishes it.
type event struct {
	id   string
	key  string // routing or record key
	body []byte
}

// plan is everything the producer publishes and what a correct consumer
// must end with.
type plan struct {
	period string
	// stream holds each stream's messages in publish order, republished
	// copies included.
	stream      map[string][]event
	distinct    map[string]int // events per stream, without copies
	republished int

	renewals       int
	renewalAmount  int64
	balances       map[string]int64 // merchant → expected balance
	stock          map[string]int64 // product → expected stock
	initialStock   map[string]int64
	orders, lines  int
	merchants      int
	products       int
	orderPaidTotal int64
}

// Plan prices of the renewals, in đồng.
var prices = []int64{199_000, 299_000, 499_000, 990_000, 1_490_000, 5_000_000}

// newPlan builds a deterministic scenario from seed: renewals renewals (one
// customer and subscription each, one period), renewals/2 orders, and a
// share of every stream published a second time with the same event ID, a
// few positions later, as a producer retrying after a lost confirm does.
func newPlan(renewals int, seed int64, republish float64) *plan {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x1de5))
	p := &plan{
		period: "2026-03", stream: map[string][]event{}, distinct: map[string]int{},
		renewals: renewals, balances: map[string]int64{}, stock: map[string]int64{}, initialStock: map[string]int64{},
	}
	seen := map[string]bool{}
	newID := func() string {
		for {
			id := fmt.Sprintf("msg-%04x%04x-%04x", rng.Uint32()>>16, rng.Uint32()>>16, rng.Uint32()>>16)
			if !seen[id] {
				seen[id] = true
				return id
			}
		}
	}
	add := func(stream, key string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err) // plain structs of strings and integers always marshal
		}
		var id string
		switch e := v.(type) {
		case billing.SubscriptionRenewed:
			id = e.EventID
		case billing.OrderPaid:
			id = e.EventID
		case billing.OrderPlaced:
			id = e.EventID
		}
		p.stream[stream] = append(p.stream[stream], event{id: id, key: key, body: b})
		p.distinct[stream]++
	}

	for i := range renewals {
		r := billing.SubscriptionRenewed{
			EventID:        newID(),
			SubscriptionID: fmt.Sprintf("sub-%05d", i+1),
			CustomerID:     fmt.Sprintf("cus-%05d", i+1),
			Period:         p.period,
			Amount:         prices[rng.IntN(len(prices))],
		}
		p.renewalAmount += r.Amount
		add(streamRenewals, r.CustomerID, r)
	}

	p.merchants = max(2, renewals/80)
	p.products = max(3, renewals/25)
	unit := make([]int64, p.products)
	for i := range p.products {
		id := fmt.Sprintf("sku-%04d", i+1)
		p.initialStock[id] = 10_000
		p.stock[id] = 10_000
		unit[i] = 12_500 * int64(1+rng.IntN(8)) // 12,500 is the incident's OrderPaid amount
	}
	p.orders = max(1, renewals/2)
	for i := range p.orders {
		order := fmt.Sprintf("ord-%06d", i+1)
		var total int64
		lines := 1 + rng.IntN(3)
		used := map[int]bool{}
		for range lines {
			k := rng.IntN(p.products)
			if used[k] {
				continue // one line per product: the line's key is order:product
			}
			used[k] = true
			q := int64(1 + rng.IntN(3))
			prod := fmt.Sprintf("sku-%04d", k+1)
			total += q * unit[k]
			p.stock[prod] -= q
			p.lines++
			add(streamPlaced, prod, billing.OrderPlaced{EventID: newID(), OrderID: order, ProductID: prod, Quantity: q})
		}
		merchant := fmt.Sprintf("mer-%03d", 1+rng.IntN(p.merchants))
		p.balances[merchant] += total
		p.orderPaidTotal += total
		add(streamPaid, merchant, billing.OrderPaid{EventID: newID(), OrderID: order, MerchantID: merchant, Amount: total})
	}

	for _, s := range streams {
		evs := p.stream[s]
		out := make([]event, 0, len(evs)+len(evs)/10)
		var later []struct {
			at int
			ev event
		}
		for i, ev := range evs {
			out = append(out, ev)
			if rng.Float64() < republish {
				later = append(later, struct {
					at int
					ev event
				}{i + 1 + rng.IntN(200), ev})
			}
			kept := later[:0]
			for _, l := range later {
				if l.at <= i {
					out = append(out, l.ev)
					p.republished++
				} else {
					kept = append(kept, l)
				}
			}
			later = kept
		}
		for _, l := range later {
			out = append(out, l.ev)
			p.republished++
		}
		p.stream[s] = out
	}
	return p
}

// published returns how many messages were published on stream.
func (p *plan) published(stream string) int { return len(p.stream[stream]) }

// total returns how many messages were published on every stream.
func (p *plan) total() int {
	n := 0
	for _, s := range streams {
		n += len(p.stream[s])
	}
	return n
}
