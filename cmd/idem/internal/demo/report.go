package demo

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// DuplicateInvoiceQuery is the incident's first tracing step: customers
// with more than one invoice for a period. It is run unchanged on both sides.
const DuplicateInvoiceQuery = `SELECT customer_id, period, COUNT(*) AS invoices
FROM invoices
GROUP BY customer_id, period
HAVING COUNT(*) > 1`

// Report is what both sides did with the same deliveries.
//
// With one Seed, the messages published are the same from run to run; the
// deliveries the broker restart catches unacknowledged depend on timing,
// so CaughtByRestart, the naive side's damage and the idem side's
// DuplicatesSkipped vary. [Report.OK] does not: the naive side applies
// redelivered events again, the idem side none.
type Report struct {
	Broker   string `json:"broker"`
	Database string `json:"database"`
	// Seed is the random seed the events were generated with.
	Seed        int64 `json:"seed"`
	Renewals    int   `json:"renewals"`
	Orders      int   `json:"orders"`
	OrderLines  int   `json:"order_lines"`
	Merchants   int   `json:"merchants"`
	Products    int   `json:"products"`
	Published   int   `json:"published"`
	Republished int   `json:"republished"`
	// Query is the duplicate-invoice query run on both sides.
	Query   string        `json:"duplicate_invoice_query"`
	Naive   SideReport    `json:"naive"`
	Idem    SideReport    `json:"idem"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

// SideReport is one side's damage, measured in its database and at its
// payment gateway.
type SideReport struct {
	// CaughtByRestart counts deliveries the broker restart caught processed
	// but unacknowledged: all were delivered again.
	CaughtByRestart int `json:"caught_by_restart"`
	// Invoices counts invoice rows; Renewals is what a correct consumer
	// writes.
	Invoices int `json:"invoices"`
	// DuplicateInvoices counts invoices beyond the first of a customer and
	// period.
	DuplicateInvoices int `json:"duplicate_invoices"`
	// CustomersDoubleBilled counts customers with a duplicate invoice;
	// DuplicateQueryRows is the row count of [DuplicateInvoiceQuery].
	CustomersDoubleBilled int   `json:"customers_double_billed"`
	DuplicateQueryRows    int   `json:"duplicate_query_rows"`
	AmountDoubleBilled    int64 `json:"amount_double_billed"`
	// Charges is what the gateway really charged; ChargesExpected is one per
	// renewal. ChargesReplayed counts requests answered from an idempotency
	// key already used.
	Charges               int   `json:"charges"`
	ChargesExpected       int   `json:"charges_expected"`
	AmountCharged         int64 `json:"amount_charged"`
	AmountExpected        int64 `json:"amount_expected"`
	CustomersChargedTwice int   `json:"customers_charged_twice"`
	ChargesReplayed       int   `json:"charges_replayed"`
	// MerchantsOff counts merchant balances that differ from the orders
	// paid; BalanceOff is the sum of the differences.
	MerchantsOff int   `json:"merchants_off"`
	Merchants    int   `json:"merchants"`
	BalanceOff   int64 `json:"balance_off"`
	// ProductsOff counts products whose stock differs from the orders
	// placed; StockOff is the units missing in total.
	ProductsOff int   `json:"products_off"`
	Products    int   `json:"products"`
	StockOff    int64 `json:"stock_off"`
	// Applied and DuplicatesSkipped count the processors' outcomes;
	// EventsExpected is the number of distinct events published.
	Applied           int `json:"applied"`
	DuplicatesSkipped int `json:"duplicates_skipped"`
	DeadLettered      int `json:"dead_lettered"`
	EventsExpected    int `json:"events_expected"`
	// Where says where the side's data is kept for inspection (a schema or
	// a file); empty when it was in a temporary directory removed at the
	// end of the run.
	Where string `json:"where,omitempty"`
}

// OK reports whether the idem side came through the incident untouched:
// no duplicate effect anywhere and every event applied exactly once.
func (r *Report) OK() bool {
	s := r.Idem
	return s.DuplicateInvoices == 0 && s.DuplicateQueryRows == 0 && s.Invoices == r.Renewals &&
		s.Charges == s.ChargesExpected && s.AmountCharged == s.AmountExpected && s.CustomersChargedTwice == 0 &&
		s.MerchantsOff == 0 && s.ProductsOff == 0 &&
		s.Applied == s.EventsExpected && s.DeadLettered == 0
}

// Damaged reports whether the naive side shows duplicate effects, that is,
// whether the run really exercised redelivery.
func (r *Report) Damaged() bool {
	return r.Naive.DuplicateInvoices > 0 && r.Naive.Charges > r.Naive.ChargesExpected
}

// measure reads a side's damage from its database and gateway.
func measure(ctx context.Context, s *side, p *plan) (*SideReport, error) {
	r := &SideReport{
		ChargesExpected: p.renewals, AmountExpected: p.renewalAmount,
		Merchants: p.merchants, Products: p.products, EventsExpected: p.distinct[streamRenewals] + p.distinct[streamPaid] + p.distinct[streamPlaced],
		Where: s.where,
	}
	one := func(dst any, q string) error {
		if err := s.db.QueryRowContext(ctx, q).Scan(dst); err != nil {
			return fmt.Errorf("measuring the %s side: %s: %w", s.name, strings.Fields(q)[1], err)
		}
		return nil
	}
	if err := one(&r.Invoices, `SELECT COUNT(*) FROM invoices`); err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, DuplicateInvoiceQuery)
	if err != nil {
		return nil, fmt.Errorf("running the duplicate-invoice query on the %s side: %w", s.name, err)
	}
	for rows.Next() {
		var cus, period string
		var n int
		if err := rows.Scan(&cus, &period, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading the duplicate-invoice query: %w", err)
		}
		r.DuplicateQueryRows++
		r.DuplicateInvoices += n - 1
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("running the duplicate-invoice query on the %s side: %w", s.name, err)
	}
	if err := one(&r.CustomersDoubleBilled, `SELECT COUNT(DISTINCT customer_id) FROM (
		SELECT customer_id FROM invoices GROUP BY customer_id, period HAVING COUNT(*) > 1) d`); err != nil {
		return nil, err
	}
	// The incident's "amount billed too much": per customer and period,
	// all but one invoice.
	if err := one(&r.AmountDoubleBilled, `SELECT COALESCE(SUM(extra), 0) FROM (
		SELECT SUM(amount) - MAX(amount) AS extra FROM invoices
		GROUP BY customer_id, period HAVING COUNT(*) > 1) d`); err != nil {
		return nil, err
	}
	g := s.gateway.Stats()
	r.Charges, r.AmountCharged, r.ChargesReplayed, r.CustomersChargedTwice = g.Charges, g.Amount, g.Replayed, g.CustomersChargedTwice

	balances := map[string]int64{}
	if err := scanPairs(ctx, s, `SELECT merchant_id, balance FROM merchant_balances`, balances); err != nil {
		return nil, err
	}
	for m, want := range p.balances {
		if d := balances[m] - want; d != 0 {
			r.MerchantsOff++
			r.BalanceOff += abs(d)
		}
	}
	stock := map[string]int64{}
	if err := scanPairs(ctx, s, `SELECT product_id, quantity FROM stock`, stock); err != nil {
		return nil, err
	}
	for prod, want := range p.stock {
		if d := stock[prod] - want; d != 0 {
			r.ProductsOff++
			r.StockOff += abs(d)
		}
	}
	r.Applied = s.obs.count(idem.Applied)
	r.DuplicatesSkipped = s.obs.count(idem.Duplicate)
	r.DeadLettered = s.obs.count(idem.DeadLettered) + s.obs.count(idem.Expired)
	return r, nil
}

func scanPairs(ctx context.Context, s *side, q string, into map[string]int64) error {
	rows, err := s.db.QueryContext(ctx, q)
	if err != nil {
		return fmt.Errorf("measuring the %s side: %w", s.name, err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			return fmt.Errorf("measuring the %s side: %w", s.name, err)
		}
		into[k] = v
	}
	return rows.Err()
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// WriteText writes the report as a person reads it: the scenario, the
// side-by-side table, the incident's query on both sides and the
// verdict.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	n, i := r.Naive, r.Idem
	fmt.Fprintf(&b, "idem demo: the billing incident told in docs/design.md, replayed on %s + %s (--seed %d)\n", r.Broker, r.Database, r.Seed)
	fmt.Fprintf(&b, "  %s renewals and %s orders (%s order lines) published; the producer republished %s of them with the same event ID.\n",
		num(r.Renewals), num(r.Orders), num(r.OrderLines), num(r.Republished))
	fmt.Fprintf(&b, "  Broker restart mid-stream: %s deliveries (naive) and %s (idem), over three consumers each, were processed but not yet acknowledged, and were delivered again.\n\n",
		num(n.CaughtByRestart), num(i.CaughtByRestart))

	rows := [][3]string{
		{"", "naive", "idem"},
		{"invoices", num(n.Invoices), num(i.Invoices)},
		{"duplicate invoices", num(n.DuplicateInvoices), num(i.DuplicateInvoices)},
		{"customers double-billed", num(n.CustomersDoubleBilled), num(i.CustomersDoubleBilled)},
		{"amount double-billed", money(n.AmountDoubleBilled), money(i.AmountDoubleBilled)},
		{"charges made / expected", num(n.Charges) + " / " + num(n.ChargesExpected), num(i.Charges) + " / " + num(i.ChargesExpected)},
		{"amount charged too much", money(n.AmountCharged - n.AmountExpected), money(i.AmountCharged - i.AmountExpected)},
		{"merchant balances off", num(n.MerchantsOff) + " of " + num(n.Merchants), num(i.MerchantsOff) + " of " + num(i.Merchants)},
		{"stock off (products)", num(n.ProductsOff) + " of " + num(n.Products), num(i.ProductsOff) + " of " + num(i.Products)},
		{"duplicates skipped", num(n.DuplicatesSkipped), num(i.DuplicatesSkipped)},
	}
	w0, w1, w2 := 0, 0, 0
	for _, row := range rows {
		w0, w1, w2 = max(w0, len(row[0])), max(w1, runeLen(row[1])), max(w2, runeLen(row[2]))
	}
	for k, row := range rows {
		fmt.Fprintf(&b, "  %-*s  %s  %s\n", w0, row[0], pad(row[1], w1), pad(row[2], w2))
		if k == 0 {
			fmt.Fprintf(&b, "  %s  %s  %s\n", strings.Repeat("─", w0), strings.Repeat("─", w1), strings.Repeat("─", w2))
		}
	}
	fmt.Fprintf(&b, "\nThe incident's duplicate-invoice query, on both sides:\n")
	for _, l := range strings.Split(r.Query, "\n") {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	fmt.Fprintf(&b, "  → naive: %s rows    idem: %s rows\n\n", num(n.DuplicateQueryRows), num(i.DuplicateQueryRows))
	if n.Where != "" && i.Where != "" {
		fmt.Fprintf(&b, "Both sides are kept for inspection: naive in %s, idem in %s.\n", n.Where, i.Where)
	}
	if i.ChargesReplayed > 0 {
		fmt.Fprintf(&b, "The idem charge relay was killed once between charging and marking: %s charges were sent again and the gateway answered them from their idempotency keys.\n", num(i.ChargesReplayed))
	}
	fmt.Fprintf(&b, "\nWhat varies between runs: which deliveries the restart catches unacknowledged depends on timing, so the restart's catch, the naive side's damage and the redeliveries skipped differ from run to run, even with the same --seed (which fixes the events published).\n")
	fmt.Fprintf(&b, "What does not: the naive side applies redelivered events again; the idem side applies each event once.\n")
	if r.OK() {
		fmt.Fprintf(&b, "idem: every one of the %s events applied exactly once, %s redeliveries skipped, 0 duplicate effects. (%.1fs)\n",
			num(i.EventsExpected), num(i.DuplicatesSkipped), r.Elapsed.Seconds())
	} else {
		fmt.Fprintf(&b, "idem: FAILED: duplicate effects or missing events on the idem side (applied %s of %s, %s dead-lettered). (%.1fs)\n",
			num(i.Applied), num(i.EventsExpected), num(i.DeadLettered), r.Elapsed.Seconds())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// num formats n with thousands separators.
func num[T int | int64](n T) string {
	s := strconv.FormatInt(int64(abs(int64(n))), 10)
	var b strings.Builder
	if n < 0 {
		b.WriteByte('-')
	}
	for k, c := range s {
		if k > 0 && (len(s)-k)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func money(n int64) string { return num(n) + " ₫" }

func runeLen(s string) int { return len([]rune(s)) }

func pad(s string, w int) string { return strings.Repeat(" ", max(0, w-runeLen(s))) + s }
